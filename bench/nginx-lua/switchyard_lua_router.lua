-- The peer of bench/bench_fleet.py: seed 000's design on nginx+Lua. Routes are read from Redis
-- (Switchyard's documented layout), cached in a per-worker LRU, and invalidated by the
-- Pub/Sub events Switchyard publishes. Exact hosts only; the first backend of each app.
local lrucache = require "resty.lrucache"
local cjson = require "cjson.safe"
local balancer = require "ngx.balancer"

local _M = {}
local cache, redis_host, redis_port

local function read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then return nil, err end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == "$" then
    local n = tonumber(rest)
    if n < 0 then return ngx.null end
    local data, err2 = sock:receive(n + 2)
    if not data then return nil, err2 end
    return data:sub(1, n)
  elseif kind == "*" then
    local items = {}
    for i = 1, tonumber(rest) do
      local item, err2 = read_reply(sock)
      if item == nil then return nil, err2 end
      items[i] = item
    end
    return items
  elseif kind == "-" then
    return nil, rest
  end
  return rest
end

local function command(sock, ...)
  local args = { ... }
  local parts = { "*" .. #args .. "\r\n" }
  for _, a in ipairs(args) do
    a = tostring(a)
    parts[#parts + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  local ok, err = sock:send(table.concat(parts))
  if not ok then return nil, err end
  return read_reply(sock)
end

local function redis_get(key)
  local sock = ngx.socket.tcp()
  sock:settimeout(500)
  local ok, err = sock:connect(redis_host, redis_port)
  if not ok then return nil, err end
  local value, err2 = command(sock, "GET", key)
  if value ~= nil then sock:setkeepalive(10000, 64) else sock:close() end
  return value, err2
end

function _M.init(host, port, size)
  redis_host, redis_port = host, port
  cache = lrucache.new(size)
end

local function subscriber(premature)
  if premature then return end
  local sock = ngx.socket.tcp()
  sock:settimeout(1000)
  if sock:connect(redis_host, redis_port) and command(sock, "SUBSCRIBE", "switchyard:changes") then
    cache:flush_all() -- events may have been missed while unsubscribed
    sock:settimeout(3600000)
    while true do
      local msg, err = read_reply(sock)
      if msg == nil then
        if err ~= "timeout" then break end
      elseif type(msg) == "table" and msg[1] == "message" then
        local event = cjson.decode(msg[3])
        if event and event.kind == "app" then
          cache:delete("app:" .. event.name)
          for _, d in ipairs(event.domains or {}) do cache:delete("domain:" .. d) end
        end
      end
    end
  end
  sock:close()
  ngx.timer.at(0.1, subscriber)
end

function _M.start_subscriber()
  ngx.timer.at(0, subscriber)
end

function _M.route()
  local host = ngx.var.host
  local name = cache:get("domain:" .. host)
  if name == nil then
    local value = redis_get("switchyard:domain:" .. host)
    if value == nil then return ngx.exit(503) end
    name = value ~= ngx.null and value or false
    cache:set("domain:" .. host, name)
  end
  if not name then return ngx.exit(404) end
  local backend = cache:get("app:" .. name)
  if backend == nil then
    local value = redis_get("switchyard:app:" .. name)
    if value == nil then return ngx.exit(503) end
    local app = value ~= ngx.null and cjson.decode(value)
    local first = app and app.backends and app.backends[1]
    if first then
      local ip, port = first.address:match("^(.*):(%d+)$")
      backend = { ip, tonumber(port) }
    else
      backend = false
    end
    cache:set("app:" .. name, backend)
  end
  if not backend then return ngx.exit(502) end
  ngx.ctx.backend = backend
end

function _M.balance()
  local backend = ngx.ctx.backend
  balancer.set_current_peer(backend[1], backend[2])
end

return _M
