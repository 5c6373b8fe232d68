//! Where a Redis link connects: one server named by its URL, or the primary that a set of
//! Redis Sentinels names, which moves when they fail over.
//!
//! Finding the primary follows the Sentinel client guidelines (redis.io, "Sentinel client
//! spec"): ask each Sentinel in turn with `SENTINEL get-master-addr-by-name`, take the first
//! answer, and check with `ROLE` that the server named is a primary, since a Sentinel may
//! still name the old one for a moment after a failover. Every step has a deadline: a
//! Sentinel that does not answer must not hold the link longer than one connect timeout.
//! (redis-rs's own `sentinel` module has no deadline per Sentinel and does not follow
//! `+switch-master`; the link does that, in `redis_link`.)

use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

/// The Sentinel port when a URL gives none.
const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// Most Sentinels one URL may name.
const MAX_SENTINELS: usize = 16;

/// A parsed Redis URL.
pub enum RedisTarget {
    /// `redis://` or `rediss://`: one server.
    Server(redis::Client),
    /// `redis+sentinel://`: the primary the Sentinels name.
    Sentinel(SentinelTarget),
}

/// The Sentinels of one monitored primary and how to talk to its servers.
pub struct SentinelTarget {
    /// `host:port` of each Sentinel, asked in this order.
    sentinels: Vec<(String, u16)>,
    /// The name the Sentinels monitor the primary under.
    master: String,
    /// Database and credentials for the primary (the Sentinels themselves are asked
    /// without credentials).
    node: RedisConnectionInfo,
}

impl RedisTarget {
    /// Parses `redis://…`, `rediss://…` or
    /// `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/MASTER_NAME[/DB]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        match url.strip_prefix("redis+sentinel://") {
            Some(rest) => SentinelTarget::parse(rest).map(Self::Sentinel),
            None if url.starts_with("redis://") || url.starts_with("rediss://") => {
                redis::Client::open(url)
                    .map(Self::Server)
                    .map_err(|e| format!("invalid Redis URL: {e}"))
            }
            None => Err("must be redis://HOST:PORT/DB, rediss://HOST:PORT/DB or \
                 redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB"
                .into()),
        }
    }
}

impl SentinelTarget {
    fn parse(rest: &str) -> Result<Self, String> {
        let (authority, path) = rest.split_once('/').ok_or(
            "a Sentinel URL needs the monitored primary's name: \
             redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB",
        )?;
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials), hosts),
            None => (None, authority),
        };
        let mut node = RedisConnectionInfo::default();
        if let Some(credentials) = credentials {
            let (user, password) = credentials.split_once(':').unwrap_or(("", credentials));
            if !user.is_empty() {
                node.username = Some(percent_decode(user)?);
            }
            if !password.is_empty() {
                node.password = Some(percent_decode(password)?);
            }
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            sentinels.push(parse_host_port(host)?);
        }
        if sentinels.len() > MAX_SENTINELS {
            return Err(format!("at most {MAX_SENTINELS} Sentinels"));
        }
        let mut segments = path.split('/');
        let master = segments.next().unwrap_or("");
        if master.is_empty() {
            return Err("the monitored primary's name is missing after the Sentinels".into());
        }
        if let Some(db) = segments.next().filter(|db| !db.is_empty()) {
            node.db = db
                .parse()
                .map_err(|_| format!("'{db}' is not a database number"))?;
        }
        if segments.next().is_some() {
            return Err("nothing may follow the database number".into());
        }
        Ok(Self {
            sentinels,
            master: master.to_string(),
            node,
        })
    }

    /// The name the Sentinels monitor.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// The Sentinels, as `host:port`, for status and logs.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect()
    }

    /// The database number on the primary.
    pub fn db(&self) -> i64 {
        self.node.db
    }

    /// A client for one Sentinel.
    pub(crate) fn sentinel_client(&self, index: usize) -> Option<redis::Client> {
        let (host, port) = self.sentinels.get(index)?;
        redis::Client::open(ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.clone(), *port),
            redis: RedisConnectionInfo::default(),
        })
        .ok()
    }

    /// How many Sentinels there are.
    pub(crate) fn sentinel_count(&self) -> usize {
        self.sentinels.len()
    }

    /// A client for the server at `host:port`, with the primary's database and credentials.
    pub(crate) fn client_for(&self, primary: &(String, u16)) -> Result<redis::Client, String> {
        redis::Client::open(ConnectionInfo {
            addr: ConnectionAddr::Tcp(primary.0.clone(), primary.1),
            redis: self.node.clone(),
        })
        .map_err(|e| e.to_string())
    }

    /// The current primary: the first Sentinel that names one, checked with `ROLE`. Each
    /// Sentinel and the check get `deadline`.
    pub(crate) async fn find_primary(&self, deadline: Duration) -> Result<(String, u16), String> {
        let mut reasons = Vec::new();
        for index in 0..self.sentinels.len() {
            let named = match self.ask(index, deadline).await {
                Ok(Some(named)) => named,
                Ok(None) => {
                    reasons.push(format!(
                        "{}: does not monitor '{}'",
                        self.sentinels()[index],
                        self.master
                    ));
                    continue;
                }
                Err(reason) => {
                    reasons.push(format!("{}: {reason}", self.sentinels()[index]));
                    continue;
                }
            };
            // A Sentinel names the old primary until it agrees on a failover: only a server
            // that says it is a primary is taken; the others may know better.
            match self.role_of(&named, deadline).await {
                Ok(role) if role == "master" => return Ok(named),
                Ok(role) => reasons.push(format!(
                    "{}:{} named by {} is a {role}",
                    named.0,
                    named.1,
                    self.sentinels()[index]
                )),
                Err(reason) => reasons.push(format!("{}:{}: {reason}", named.0, named.1)),
            }
        }
        Err(format!(
            "no primary for '{}': {}",
            self.master,
            reasons.join("; ")
        ))
    }

    async fn ask(&self, index: usize, deadline: Duration) -> Result<Option<(String, u16)>, String> {
        let client = self
            .sentinel_client(index)
            .ok_or("no such Sentinel".to_string())?;
        let master = self.master.clone();
        let query = async move {
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut connection)
                .await
        };
        match tokio::time::timeout(deadline, query).await {
            Ok(Ok(named)) => Ok(named),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within the deadline".into()),
        }
    }

    async fn role_of(&self, server: &(String, u16), deadline: Duration) -> Result<String, String> {
        let client = self.client_for(server)?;
        let query = async move {
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE")
                .query_async::<Vec<redis::Value>>(&mut connection)
                .await
        };
        match tokio::time::timeout(deadline, query).await {
            Ok(Ok(reply)) => match reply.first() {
                Some(redis::Value::BulkString(role)) => Ok(String::from_utf8_lossy(role).into()),
                Some(redis::Value::SimpleString(role)) => Ok(role.clone()),
                _ => Err("an unreadable ROLE reply".into()),
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within the deadline".into()),
        }
    }
}

/// `host`, `host:port` or `[v6]:port`.
fn parse_host_port(input: &str) -> Result<(String, u16), String> {
    if input.is_empty() {
        return Err("an empty Sentinel address".into());
    }
    let (host, port) = if let Some(rest) = input.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or(format!("'{input}': an unclosed '['"))?;
        (host, after.strip_prefix(':'))
    } else {
        match input.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (input, None),
        }
    };
    if host.is_empty() {
        return Err(format!("'{input}': no host"));
    }
    let port = match port {
        Some(port) => port
            .parse()
            .map_err(|_| format!("'{input}': '{port}' is not a port"))?,
        None => DEFAULT_SENTINEL_PORT,
    };
    Ok((host.to_string(), port))
}

/// Decodes `%XX` escapes (a password put into the URL from the environment is encoded).
fn percent_decode(input: &str) -> Result<String, String> {
    let bytes = input.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = input
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or("a '%' escape in the credentials is not two hex digits")?;
            decoded.push(hex);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| "the credentials are not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(url: &str) -> SentinelTarget {
        match RedisTarget::parse(url) {
            Ok(RedisTarget::Sentinel(target)) => target,
            Ok(RedisTarget::Server(_)) => panic!("{url} parsed as one server"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_primary_and_the_database() {
        let target = sentinel("redis+sentinel://:p%40ss@10.0.0.1:26379,s2,[::1]:5000/main/3");
        assert_eq!(
            target.sentinels(),
            ["10.0.0.1:26379", "s2:26379", "::1:5000"]
        );
        assert_eq!(target.master(), "main");
        assert_eq!(target.db(), 3);
        assert_eq!(target.node.password.as_deref(), Some("p@ss"));
        assert_eq!(target.node.username, None);

        let plain = sentinel("redis+sentinel://user:pw@h:1/m");
        assert_eq!(plain.db(), 0);
        assert_eq!(plain.node.username.as_deref(), Some("user"));
    }

    #[test]
    fn a_malformed_sentinel_url_is_refused_with_its_reason() {
        for (url, reason) in [
            ("redis+sentinel://h:1", "primary's name"),
            ("redis+sentinel://h:1/", "name is missing"),
            ("redis+sentinel://h:x/m", "not a port"),
            ("redis+sentinel://h:1,,h:2/m", "empty Sentinel"),
            ("redis+sentinel://h:1/m/zero", "not a database"),
            ("redis+sentinel://h:1/m/0/x", "nothing may follow"),
            ("redis+sentinel://:%zz@h:1/m", "hex digits"),
            ("http://h:1/0", "must be redis://"),
        ] {
            match RedisTarget::parse(url) {
                Err(e) => assert!(e.contains(reason), "{url}: {e}"),
                Ok(_) => panic!("{url} was accepted"),
            }
        }
    }
}
