#!/bin/sh
# Installs the Debian package and starts its unit the way systemd would, in a throwaway
# copy of this machine: run by tests/deb_package.rs under `unshare --mount --net --pid`,
# it mounts an overlay over / whose writes land in a tmpfs, so dpkg, the maintainer scripts
# and the router change nothing outside. $WORK: an empty directory; $DEB: the package.
# $SANDBOX: tests/unit_sandbox.py, which applies the unit's system-call filter, address
# families and umask as systemd would. With the argument `probe`, it only makes the
# overlay: whether this machine allows it.
set -eu
mount -t tmpfs tmpfs "$WORK"
mkdir "$WORK/upper" "$WORK/work" "$WORK/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$WORK/upper,workdir=$WORK/work" "$WORK/root"
[ "${1:-}" = probe ] && exit 0
root="$WORK/root"
mount --rbind /dev "$root/dev"
# ProtectProc=invisible: other users' processes hidden.
mount -t proc -o hidepid=invisible proc "$root/proc"
mount -t tmpfs tmpfs "$root/tmp"
# No /run/systemd/system: the maintainer scripts see a machine without systemd running.
mount -t tmpfs tmpfs "$root/run"
cp "$DEB" "$root/tmp/switchyard.deb"
exec chroot "$root" sh -eu -c '
ip link set lo up
dpkg -i /tmp/switchyard.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; exit 1; }
echo "status: $(dpkg-query -W -f="\${Status}" switchyard)"
[ -L /etc/systemd/system/multi-user.target.wants/switchyard.service ] && echo "enabled: yes"

# What systemd would do for the unit: its environment, a user of its own (DynamicUser:
# here nobody), its state directory owned by that user, its ambient capabilities and
# bounding set, no new privileges, its system-call filter and umask, then its ExecStart.
unit=/usr/lib/systemd/system/switchyard.service
field() { sed -n "s/^$1=//p" "$unit"; }
state="/var/lib/$(field StateDirectory)"
mkdir -p "$state"
chown 65534:65534 "$state"
chmod "$(field StateDirectoryMode)" "$state"
caps=$(field AmbientCapabilities | tr "A-Z" "a-z" | sed "s/cap_/+/g; s/ /,/g")
settings=$(field ExecStart | sed -n "s/.*--config \([^ ]*\).*/\1/p")
admin=$(sed -n "s/^admin = \"\(.*\)\"/\1/p" "$settings")
env $(field Environment) setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs \
    --inh-caps "$caps" --ambient-caps "$caps" --bounding-set "-all,$caps" \
    /usr/bin/python3 "$SANDBOX" "$unit" $(field ExecStart) >/tmp/router.log 2>&1 &
router=$!
up=no
for _ in $(seq 150); do
    if curl -sf "http://$admin/healthz" >/dev/null; then up=yes; break; fi
    sleep 0.2
done
[ "$up" = yes ] || { echo "the router did not answer:"; cat /tmp/router.log; exit 1; }
echo "healthz: $(curl -s "http://$admin/healthz")"
echo "user: $(sed -n "s/^Uid:\t\([0-9]*\).*/\1/p" /proc/$router/status)"
echo "seccomp: $(sed -n "s/^Seccomp:\t//p" /proc/$router/status)"
echo "put: $(curl -s -o /dev/null -w "%{http_code}" -X PUT -d "{\"domains\": [\"demo.test\"]}" "http://$admin/v1/apps/demo")"
echo "port 80: $(curl -s -o /dev/null -w "%{http_code}" -H "Host: demo.test" http://127.0.0.1/)"
echo "state: $(stat -c "%u %a" "$state") $(ls "$state" | tr "\n" " ")"
echo "store mode: $(stat -c "%a" "$state/switchyard.redb")"

# `systemctl reload`: ExecReload, run as the same user, is the binary upgrade; the
# new process takes the sockets over and quits the old one, which ends by itself.
env $(field Environment) setpriv --reuid 65534 --regid 65534 --clear-groups --no-new-privs \
    --inh-caps "$caps" --ambient-caps "$caps" --bounding-set "-all,$caps" \
    /usr/bin/python3 "$SANDBOX" "$unit" /bin/sh -c "$(field ExecReload)" >>/tmp/router.log 2>&1 || { echo "reload failed: $?"; cat /tmp/router.log; exit 1; }
echo "reloaded"
code=0
wait "$router" || code=$?
echo "old router after reload: exit $code"
successor=
for p in /proc/[0-9]*; do
    [ "$(readlink "$p/exe" 2>/dev/null)" = /usr/bin/switchyard ] && successor=${p#/proc/}
done
[ -n "$successor" ] || { echo "no router after the reload:"; cat /tmp/router.log; exit 1; }
echo "after reload, user: $(sed -n "s/^Uid:\t\([0-9]*\).*/\1/p" /proc/$successor/status)"
echo "after reload, port 80: $(curl -s -o /dev/null -w "%{http_code}" -H "Host: demo.test" http://127.0.0.1/)"
kill -TERM "$successor"
for _ in $(seq 150); do [ -e "/proc/$successor" ] || break; sleep 0.2; done
[ -e "/proc/$successor" ] && echo "still running after SIGTERM" || echo "stopped: yes"
dpkg -r switchyard >>/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; exit 1; }
[ -f "$settings" ] && echo "removed, settings kept: yes"
dpkg -P switchyard >>/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; exit 1; }
[ ! -e "$settings" ] && echo "purged: yes"
'
