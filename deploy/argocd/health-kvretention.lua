-- Argo CD health check for kvretention.io/KvRetentionDeployment (Lua 5.1, as Argo CD runs it).
-- Healthy:     Ready=True, observed at the object's current generation.
-- Degraded:    Ready=False for a reason that waiting cannot fix: a bad spec, a name conflict or
--              refused write, an image that cannot be pulled, a crash loop, a failed probe, a
--              Deployment past its progress deadline or refused by a quota, an engine that cannot
--              take kv_hints or does not apply kv.retain under hints.policy=Required (the
--              operator's Warning reasons).
-- Progressing: everything else (no status yet, an older generation observed, pods still starting
--              or waiting for a node: Unschedulable may end when the cluster autoscaler adds one;
--              Progressing=False does not mean stuck: it only says every Deployment has the
--              current spec, while a large model may still be loading).
local hs = {}

-- Ready=False reasons that need a human (the hints and retention reasons reach Ready only
-- with hints.policy=Required). tests/chart/test_argocd_health.py keeps this equal to the operator's.
local permanent = {
  InvalidSpec = true,
  ChildConflict = true,
  ApplyFailed = true,
  EngineLacksKvHints = true,
  EngineUnusableForHints = true,
  TransportOnly = true,
  PluginNotSelected = true,
  PluginLoadFailed = true,
  HookTargetsMissing = true,
  HookFailures = true,
  EvictionPolicyOverridden = true,
  ProbeReportInvalid = true,
  ReplicaFailure = true,
  LeaderWorkerSetMissing = true,
  ProgressDeadlineExceeded = true,
  ErrImagePull = true,
  ImagePullBackOff = true,
  InvalidImageName = true,
  ErrImageNeverPull = true,
  RegistryUnavailable = true,
  SignatureValidationFailed = true,
  AuthSecretMissing = true,
  CodexInstructionsMissing = true,
  CreateContainerConfigError = true,
  CreateContainerError = true,
  RunContainerError = true,
  PreStartHookError = true,
  PostStartHookError = true,
  InitContainerFailed = true,
  CrashLoopBackOff = true,
  ContainerFailed = true,
  PodFailed = true,
}

local function find(conditions, ctype)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local status = obj.status

if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvretention operator to report status"
  return hs
end

if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local ready = find(status.conditions, "Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end

if generation ~= nil and ready.observedGeneration ~= nil and ready.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Ready reflects generation " .. tostring(ready.observedGeneration) .. ", not " .. tostring(generation)
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

if ready.status == "False" and permanent[ready.reason] then
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Not ready yet")
return hs
