--[[
slurm-elastic job_submit plugin: checks the elastic marker in a job's --comment at
submission.  Install: copy beside slurm.conf and set JobSubmitPlugins=lua (Debian's
job_submit_lua.so embeds Lua 5.1, so this file uses only Lua 5.1).

The grammar and the messages are those of slurm_elastic/marker.py (its docstring is the
reference; tests/test_marker_lua.py runs both on the same inputs):

  * a job without a marker is not touched;
  * a malformed marker is rejected with a one-line message saying what is wrong;
  * a marker whose min/max disagree with --nodes=MIN-MAX is rejected;
  * without --nodes the job's node range is set from the marker (min=, max=);
  * a marker without min/max is completed from --nodes (elastic -> elastic:min=2,max=8),
    because the range does not survive in Slurm once the daemon pins or resizes the job;
  * the range is capped at what the job's partitions can ever give (the fewest of a
    partition's nodes and its MaxNodes, the most of that over the job's partitions): max
    above it is lowered (on the step grid, in the marker and in --nodes), min above it is
    rejected.  So no number a user writes makes the daemon plan more sizes than there are
    nodes (the daemon caps again, for comments changed later or clusters without this file).

Companion jobs (token slurm-elastic:companion-of=<PARENT>) are never elastic: they pass.

The --elastic[=SPEC] option (etc/spank/elastic.c; Slurm hands its argument to this script
in job_desc.spank_job_env as _SLURM_SPANK_OPTION_elastic_elastic=SPEC, "(null)" without
one) is a way of writing the marker, not a second grammar: SPEC becomes a marker token,
added to the comment, and that token is checked and completed like one written there.

  SPEC     := [ range ] | range ":" options | options
  range    := MIN "-" MAX                  (-> min=MIN,max=MAX)
  options  := the marker's options         (min=1,max=4,step=2,gpus=4,cost=30)

  --elastic              -> elastic                 (the range from --nodes)
  --elastic=2-8:step=2   -> elastic:min=2,max=8,step=2

A job given both --elastic and a marker in its comment is rejected (which one is meant?).
--]]

local WORD = "elastic"
local OPTION_ENV = "_SLURM_SPANK_OPTION_elastic_elastic="
local COMPANION_PREFIX = "slurm-elastic:companion-of="
local KEYS = { "min", "max", "step", "gpus", "cost" }
local LOWEST = { min = 1, max = 1, step = 1, gpus = 0, cost = 0 }
local MAX_DIGITS = 6
local TOKEN = "[^ \t\n\v\f\r;]+"

local function is_key(key)
   for _, k in ipairs(KEYS) do
      if k == key then return true end
   end
   return false
end

local function starts_with(s, prefix)
   return string.sub(s, 1, #prefix) == prefix
end

local function is_marker_token(t)
   return t == WORD or starts_with(t, WORD .. ":") or starts_with(t, WORD .. "/")
end

-- One bounded line: a hostile comment must not smuggle newlines or pages into logs.
local function show(text, limit)
   limit = limit or 20
   local shown = text
   if #shown > limit then shown = string.sub(shown, 1, limit - 3) .. "..." end
   -- A byte-wise gsub: Lua 5.1 patterns cannot hold "\0".
   shown = string.gsub(shown, ".", function(c)
      local b = string.byte(c)
      if b < 32 or b == 127 then return "?" end
   end)
   return shown
end

local function msg(token, reason)
   return "invalid elastic marker '" .. show(token, 60) .. "': " .. reason
end

-- Every token of the comment with its byte span, in order.
local function tokens(comment)
   local out, pos = {}, 1
   while true do
      local s, e = string.find(comment, TOKEN, pos)
      if not s then break end
      table.insert(out, { text = string.sub(comment, s, e), first = s, last = e })
      pos = e + 1
   end
   return out
end

-- nil when the job is not a companion, true when it is, or (nil, message) when malformed.
local function companion(toks)
   for _, t in ipairs(toks) do
      if starts_with(t.text, "slurm-elastic:") then
         local parent = ""
         if starts_with(t.text, COMPANION_PREFIX) then
            parent = string.sub(t.text, #COMPANION_PREFIX + 1)
         end
         if not string.match(parent, "^[0-9]+$") or #parent > 12 or tonumber(parent) == 0 then
            return nil, msg(t.text, "companion token must be " .. COMPANION_PREFIX .. "<PARENT_JOBID>")
         end
         return true
      end
   end
   return nil
end

local function check_range(token, low, high, step)
   if low == nil or high == nil then return nil end
   if low > high then
      return msg(token, string.format("min=%d is greater than max=%d", low, high))
   end
   if step ~= nil and (high - low) % step ~= 0 then
      return msg(token, string.format("step=%d does not divide max-min=%d (min=%d, max=%d)",
         step, high - low, low, high))
   end
   return nil
end

-- Parse one marker token: a table {explicit, min, max, step, gpus, cost} or (nil, message).
local function parse_token(token)
   local colon = string.find(token, ":", 1, true)
   local head, options = token, nil
   if colon then
      head, options = string.sub(token, 1, colon - 1), string.sub(token, colon + 1)
   end
   local m = { explicit = false }
   if head ~= WORD then
      local version = string.sub(head, #WORD + 2)
      if version ~= "1" then
         return nil, msg(token, "unknown version '" .. show(version) .. "' (supported: 1)")
      end
      m.explicit = true
   end
   if options ~= nil then
      if options == "" then return nil, msg(token, "empty option list after ':'") end
      local pos = 1
      while pos <= #options + 1 do
         local comma = string.find(options, ",", pos, true) or (#options + 1)
         local option = string.sub(options, pos, comma - 1)
         pos = comma + 1
         local eq = string.find(option, "=", 1, true)
         if not eq or eq == 1 then
            return nil, msg(token, "option '" .. show(option) .. "' is not key=value")
         end
         local key, raw = string.sub(option, 1, eq - 1), string.sub(option, eq + 1)
         if not is_key(key) then
            return nil, msg(token, "unknown key '" .. show(key) .. "' (known: " .. table.concat(KEYS, ", ") .. ")")
         end
         if m[key] ~= nil then return nil, msg(token, "duplicate key '" .. key .. "'") end
         if not string.match(raw, "^[0-9]+$") then
            return nil, msg(token, key .. " must be a whole number, got '" .. show(raw) .. "'")
         end
         if #raw > MAX_DIGITS then
            return nil, msg(token, string.format("%s is too large (%d digits, at most 6)", key, #raw))
         end
         local value = tonumber(raw)
         if value < LOWEST[key] then
            return nil, msg(token, string.format("%s must be at least %d, got %d", key, LOWEST[key], value))
         end
         m[key] = value
      end
   end
   local err = check_range(token, m.min, m.max, m.step)
   if err then return nil, err end
   return m
end

local function format_marker(m)
   local head = WORD
   if m.explicit then head = WORD .. "/1" end
   local parts = {}
   for _, k in ipairs(KEYS) do
      if m[k] ~= nil then table.insert(parts, k .. "=" .. string.format("%d", m[k])) end
   end
   if #parts == 0 then return head end
   return head .. ":" .. table.concat(parts, ",")
end

local function given(n)
   return n ~= nil and n ~= slurm.NO_VAL and n ~= 0
end

-- What the job's partitions can ever give it, nil when none of them is known here: for each
-- partition it names (or the default one), the fewer of its nodes and its MaxNodes.
local function capacity(job_desc, part_list)
   local best = nil
   local function consider(part)
      local cap = part.total_nodes
      if cap == nil then return end
      local most = part.max_nodes
      if most ~= nil and most < cap then cap = most end
      if best == nil or cap > best then best = cap end
   end
   local names = job_desc.partition
   if names == nil or names == "" then
      for _, part in pairs(part_list or {}) do
         if part.flag_default == 1 then consider(part) end
      end
   else
      for name in string.gmatch(names, "[^,]+") do
         local part = (part_list or {})[name]
         if part ~= nil then consider(part) end
      end
   end
   return best
end

-- The --elastic option's SPEC, or nil when the job was submitted without the option.  The
-- table Slurm builds is indexed from 0: walk it with pairs.
local function option_spec(job_desc)
   for _, entry in pairs(job_desc.spank_job_env or {}) do
      if type(entry) == "string" and starts_with(entry, OPTION_ENV) then
         return string.sub(entry, #OPTION_ENV + 1)
      end
   end
   return nil
end

-- The marker token --elastic=SPEC stands for, or (nil, message).
local function option_marker(spec)
   if spec == "(null)" or spec == "" then return WORD end
   local colon = string.find(spec, ":", 1, true)
   local head, options = spec, nil
   if colon then head, options = string.sub(spec, 1, colon - 1), string.sub(spec, colon + 1) end
   if string.find(head, "=", 1, true) then
      -- No range: the whole SPEC is the marker's option list (a ':' in it is the marker's error).
      return WORD .. ":" .. spec
   end
   local low, high = string.match(head, "^([0-9]+)%-([0-9]+)$")
   if not low then
      return nil, "'" .. show(head) .. "' is not a node range MIN-MAX"
   end
   local token = WORD .. ":min=" .. low .. ",max=" .. high
   if options ~= nil then token = token .. "," .. options end
   return token
end

-- How a message names the option the user gave.
local function option_named(spec)
   if spec == "(null)" then return "--elastic" end
   return "--elastic=" .. show(spec, 60)
end

-- The comment the job is checked with: its own, plus the marker --elastic stands for; and
-- the option's SPEC (nil without the option).  (nil, spec, message) when the option is bad.
local function with_option(job_desc)
   local comment = job_desc.comment
   local spec = option_spec(job_desc)
   if spec == nil then return comment, nil end
   for _, t in ipairs(tokens(comment or "")) do
      if is_marker_token(t.text) then
         return nil, spec, "invalid " .. option_named(spec) .. ": the comment has an elastic "
            .. "marker too ('" .. show(t.text, 60) .. "'): give one of them"
      end
   end
   local token, err = option_marker(spec)
   if not token then return nil, spec, "invalid " .. option_named(spec) .. ": " .. err end
   if comment == nil or comment == "" then return token, spec end
   return comment .. " " .. token, spec
end

-- The whole check for one submission: (new_comment_or_nil, new_min, new_max) or (nil, message).
local function check(job_desc, part_list, comment)
   if comment == nil or comment == "" then return { } end
   local toks = tokens(comment)
   local is_companion, err = companion(toks)
   if err then return nil, err end
   if is_companion then return { } end
   local marker_tok, count = nil, 0
   for _, t in ipairs(toks) do
      if is_marker_token(t.text) then
         count = count + 1
         if count == 2 then
            return nil, msg(t.text, "more than one elastic marker in the comment")
         end
         marker_tok = t
      end
   end
   if marker_tok == nil then return { } end
   local token = marker_tok.text
   local m, perr = parse_token(token)
   if not m then return nil, perr end

   local low, high
   local result = { }
   if given(job_desc.min_nodes) then
      low = job_desc.min_nodes
      high = low
      if given(job_desc.max_nodes) then high = job_desc.max_nodes end
      local range = tostring(low)
      if high ~= low then range = low .. "-" .. high end
      if m.min ~= nil and m.min ~= low then
         return nil, msg(token, string.format("min=%d disagrees with --nodes=%s", m.min, range))
      end
      if m.max ~= nil and m.max ~= high then
         return nil, msg(token, string.format("max=%d disagrees with --nodes=%s", m.max, range))
      end
   else
      if m.min == nil then
         return nil, msg(token, "no node range: give --nodes=MIN-MAX or min= in the marker")
      end
      low = m.min
      high = m.max or m.min
      result.min_nodes, result.max_nodes = low, high
   end
   local rerr = check_range(token, low, high, m.step)
   if rerr then return nil, rerr end
   local cap = capacity(job_desc, part_list)
   if cap ~= nil and low > cap then
      return nil, msg(token, string.format("min=%d is more than the %d nodes its partitions can give",
         low, cap))
   end
   if cap ~= nil and high > cap then
      high = low + math.floor((cap - low) / (m.step or 1)) * (m.step or 1)
      result.min_nodes, result.max_nodes = low, high
   end
   if m.min == nil or m.max ~= high then
      m.min, m.max = low, high
      result.comment = string.sub(comment, 1, marker_tok.first - 1) .. format_marker(m)
         .. string.sub(comment, marker_tok.last + 1)
   end
   return result
end

-- slurmctld's slurm.log_user and slurm.log_info are string.format(...) (src/lua/slurm_lua.c,
-- the same on 22.05, 24.11 and 26.05): a message is always an argument, never the format.
-- (A '%' in what a user wrote, passed as the format, raised a Lua error there, and slurmctld
-- then took the job unchecked.)
local function tell_user(text)
   slurm.log_user("%s", text)
end

local function submit(job_desc, part_list, submit_uid)
   local comment, spec, err = with_option(job_desc)
   local result = nil
   if not err then
      result, err = check(job_desc, part_list, comment)
      if result and result.comment == nil and comment ~= job_desc.comment then
         result.comment = comment
      end
      if not result and spec ~= nil then
         -- The option's marker is the only one: name the option, not the token it made,
         -- and give the marker's advice in the option's words.
         local reason = string.match(err, "^invalid elastic marker '.-': (.*)$") or err
         reason = string.gsub(reason, "min= in the marker$", "--elastic=MIN-MAX")
         err = "invalid " .. option_named(spec) .. ": " .. reason
      end
   end
   if not result then
      tell_user(err)
      slurm.log_info("slurm-elastic: rejected job from uid %s: %s", tostring(submit_uid), err)
      return slurm.ERROR
   end
   if result.comment ~= nil then job_desc.comment = result.comment end
   if result.min_nodes ~= nil then
      job_desc.min_nodes = result.min_nodes
      job_desc.max_nodes = result.max_nodes
   end
   return slurm.SUCCESS
end

local INTERNAL = "slurm-elastic: the elastic check of this job failed; the job is refused "
   .. "(slurmctld's log has the reason for your admin)"

-- Fails closed: whatever goes wrong inside the check refuses the job with a message (a Lua
-- error escaping here would make slurmctld accept the job unchecked).
function slurm_job_submit(job_desc, part_list, submit_uid)
   local ok, rc = pcall(submit, job_desc, part_list, submit_uid)
   if ok then return rc end
   pcall(slurm.log_info, "slurm-elastic: refused job from uid %s: error in job_submit.lua: %s",
      tostring(submit_uid), tostring(rc))
   pcall(tell_user, INTERNAL)
   return slurm.ERROR
end

-- Changing a comment with scontrol (the daemon does, for companions) is not re-checked:
-- the daemon itself ignores a malformed marker with a logged reason.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
