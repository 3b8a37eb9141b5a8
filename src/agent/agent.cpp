#include "agent/agent.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "agent/executor_util.h"
#include "agent/gpu_metrics.h"
#include "agent/log_rotation.h"
#include "agent/nvml_backend.h"
#include "agent/oci_spec.h"

namespace gpufleet::agent {
namespace {

using executor_internal::WallClockMs;

// A log request never returns more than this (the tail of the output).
constexpr int64_t kMaxLogBytes = int64_t{8} << 20;

std::string DefaultHostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string NewWorkloadId() {
  std::random_device random;
  const uint64_t bits = (uint64_t{random()} << 32) ^ random();
  return fmt::format("w-{:012x}", bits & 0xffffffffffffULL);
}

std::string JoinIndices(const std::vector<int32_t>& indices) {
  return indices.empty() ? "none" : fmt::format("{}", fmt::join(indices, ","));
}

// How a finished workload ended, for the event log.
std::string DescribeEnd(const WorkloadStatus& status) {
  switch (status.state) {
    case WorkloadState::kExited: {
      std::string how = status.signal
                            ? fmt::format("was killed by {}", SignalName(*status.signal))
                            : fmt::format("exited with code {}", status.exit_code.value_or(-1));
      if (status.cancelled) how += " (cancelled)";
      if (status.timed_out) how += " (timed out)";
      if (status.oom_killed) how += " (OOM-killed)";
      return how;
    }
    case WorkloadState::kFailedToStart:
      return "failed to start: " + status.error;
    case WorkloadState::kLost:
      return "is lost: " + status.error;
    default:
      return std::string(WorkloadStateName(status.state));
  }
}

bool HoldsGpus(WorkloadState state) {
  return state == WorkloadState::kStarting || state == WorkloadState::kRunning;
}

// The last `max_bytes` bytes of a file (all of it when smaller); empty when unreadable.
std::string ReadFileTail(const std::string& path, int64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat info {};
  std::string data;
  if (::fstat(fd, &info) == 0 && info.st_size > 0) {
    const int64_t size = info.st_size;
    const int64_t want = std::min(size, max_bytes);
    data.resize(static_cast<size_t>(want));
    int64_t done = 0;
    while (done < want) {
      ssize_t got = ::pread(fd, data.data() + done, static_cast<size_t>(want - done),
                            static_cast<off_t>(size - want + done));
      if (got <= 0) break;
      done += got;
    }
    data.resize(static_cast<size_t>(done));
  }
  ::close(fd);
  return data;
}

int64_t CountLines(std::string_view text) {
  return static_cast<int64_t>(std::count(text.begin(), text.end(), '\n')) +
         (!text.empty() && text.back() != '\n' ? 1 : 0);
}

// The last `lines` lines of `text` (a final line without a newline counts as a line).
std::string LastLines(const std::string& text, int64_t lines) {
  if (lines <= 0) return "";
  size_t position = text.size();
  if (position > 0 && text[position - 1] == '\n') --position;
  while (position > 0) {
    size_t newline = text.rfind('\n', position - 1);
    if (newline == std::string::npos) return text;
    if (--lines == 0) return text.substr(newline + 1);
    position = newline;
  }
  return text;
}

// On simulated GPUs a workload shows 100 % utilisation unless its environment sets
// GPUFLEET_SIM_GPU_UTILIZATION (percent, 0..100): the way to try idle-GPU detection and
// reclamation without GPUs (docs/quotas.md). Real GPUs report what runs on them.
double SimUtilizationOf(const std::map<std::string, std::string>& env) {
  const auto it = env.find("GPUFLEET_SIM_GPU_UTILIZATION");
  if (it == env.end()) return 1.0;
  char* end = nullptr;
  const double percent = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !(percent >= 0 && percent <= 100)) return 1.0;
  return percent / 100.0;
}

// The user's uid, primary gid and supplementary groups; nothing when there is no such user.
std::optional<WorkloadUser> LookUpUser(const std::string& name) {
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found)
    return std::nullopt;
  WorkloadUser user;
  user.uid = found->pw_uid;
  user.gid = found->pw_gid;
  user.name = name;
  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  if (::getgrouplist(name.c_str(), found->pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    ::getgrouplist(name.c_str(), found->pw_gid, groups.data(), &count);
  }
  groups.resize(static_cast<size_t>(std::max(count, 0)));
  user.groups.assign(groups.begin(), groups.end());
  return user;
}

}  // namespace

void LogToStderr(const std::string& message) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  fmt::print(stderr, "{} agent: {}\n", stamp, message);
}

std::string SignalName(int32_t signal) {
  const char* abbreviation = ::sigabbrev_np(signal);
  return abbreviation ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal);
}

namespace {

// Character devices with /dev/null's numbers: opening one works, and writes vanish.
std::optional<std::string> MakeSimDeviceFiles(const std::string& dir, GpuInventory& inventory) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return fmt::format("create '{}': {}", dir, error.message());
  for (GpuInfo& gpu : inventory.gpus) {
    const std::string path = fmt::format("{}/nvidia{}", dir, gpu.index);
    struct stat info {};
    if (::lstat(path.c_str(), &info) == 0 && !S_ISCHR(info.st_mode))
      return fmt::format("'{}' exists and is not a character device", path);
    if (::lstat(path.c_str(), &info) != 0 &&
        ::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
      return fmt::format("mknod '{}': {} (it needs root)", path, std::strerror(errno));
    gpu.device_files = {path};
  }
  return std::nullopt;
}

// Directories we hand the workload by name, which must stay where they are named.
std::vector<std::string> PlatformDirsOf(const std::map<std::string, std::string>& env) {
  std::vector<std::string> dirs;
  for (const char* name :
       {"GPUFLEET_CHECKPOINT_DIR", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"})
    if (auto entry = env.find(name);
        entry != env.end() && !entry->second.empty() && entry->second[0] == '/')
      dirs.push_back(entry->second);
  return dirs;
}

std::string CdiSpecPath(const std::string& dir, const std::string& hostname) {
  return fmt::format("{}/gpufleet-{}.json", dir, hostname);
}

// The driver's nodes every GPU container needs besides its GPUs' own.
const std::vector<std::string> kNvidiaControlNodes = {
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};

std::optional<std::string> WriteCdiSpec(const std::string& dir, const std::string& hostname,
                                        const GpuInventory& inventory) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return fmt::format("create '{}': {}", dir, error.message());
  if (auto failure = executor_internal::WriteFileAtomically(
          CdiSpecPath(dir, hostname), CdiSpecForGpus(inventory.gpus, kNvidiaControlNodes)))
    return "write the CDI spec: " + *failure;
  return std::nullopt;
}

}  // namespace

struct AgentCore::State {
  // What a workload that has not ended holds.
  struct Holding {
    std::vector<size_t> positions;      // into inventory.gpus
    MilliGpu gpu_milli = kMilliPerGpu;  // of each of them
    std::string job_label;              // the gpufleet_gpu_job label
    int32_t pid = 0;
    bool launching = false;  // reserved by Launch, not yet known to the executor
    // Simulated GPUs only: the utilisation the workload shows (kSimUtilizationEnv), 0..1.
    double sim_utilization = 1.0;
  };

  AgentOptions options;
  std::string data_dir;
  std::string hostname;
  std::unique_ptr<GpuBackend> backend;
  SimGpuBackend* sim = nullptr;                        // the backend, when simulated
  GpuSharingMode sharing = GpuSharingMode::kAdvisory;  // resolved at Open
  // Whom workloads run as (AgentOptions.workload_user, resolved at Open).
  enum class RunAs { kAgent, kPerJob, kMapped, kUser } run_as = RunAs::kAgent;
  WorkloadUser named_user;  // kUser
  // Whom the workload runs as (nothing: the agent's user), or why it may not run.
  AgentResult<std::optional<WorkloadUser>> RunAsFor(const LaunchRequest& request) const;
  bool mount_namespaces = false;      // AgentOptions.workload_isolation, resolved at Open
  ContainerRuntimeConfig containers;  // as the executor got it
  std::string cdi_spec_path;          // the GPUs' CDI spec the agent wrote; empty: none
  // What a workload on `positions` may not open: every other GPU's device files.
  WorkloadIsolation IsolationFor(const std::vector<size_t>& positions,
                                 const std::map<std::string, std::string>& env) const;
  std::unique_ptr<MpsDaemon> mps;  // when sharing is kMps
  // Sets a shared workload's limits and what it must be told (its environment); with MPS, starts
  // the node's daemon first. Takes no lock: starting the daemon takes a while.
  std::optional<std::string> HoldToShare(MilliGpu share, const std::vector<size_t>& positions,
                                         WorkloadSpec& spec);
  std::string driver_version;
  GpuInventory inventory;
  std::map<int32_t, size_t> position_of_index;
  std::vector<std::string> startup_notes;
  std::unique_ptr<Executor> executor;
  std::set<std::string> adopted_ids;

  // The sampling cycle. Lock order: sample_mutex, then mutex, then metrics_mutex.
  std::mutex sample_mutex;
  GpuHealthTracker tracker;                        // under sample_mutex
  std::vector<std::optional<GpuHealth>> reported;  // under sample_mutex: last logged verdicts
  std::string render_buffer;                       // under sample_mutex

  mutable std::mutex mutex;
  std::map<std::string, Holding> active;  // workloads that have not ended, GPUs or not
  std::vector<GpuView> latest;            // per inventory position
  mutable std::map<std::string, WorkloadSpec> spec_cache;  // a spec never changes

  // What a scrape reads; never held during sampling or file I/O.
  mutable std::mutex metrics_mutex;
  std::shared_ptr<const std::string> metrics;
  TimeMs last_sample_ms = 0;
  double last_cycle_seconds = 0;
  int64_t healthy_gpus = 0;
  int64_t active_workloads = 0;

  std::mutex wake_mutex;
  std::condition_variable wake;
  bool stopping = false;
  bool sample_requested = false;  // a launch changed what the GPUs hold: sample before the tick
  std::thread sampler;

  void Log(const std::string& message) const {
    if (options.log)
      options.log(message);
    else
      LogToStderr(message);
  }
  std::vector<int32_t> AllIndices() const {
    std::vector<int32_t> indices;
    for (const GpuInfo& info : inventory.gpus)
      indices.push_back(info.index);
    return indices;
  }
  std::vector<int32_t> IndicesOf(const std::vector<size_t>& positions) const {
    std::vector<int32_t> indices;
    for (size_t position : positions)
      indices.push_back(inventory.gpus[position].index);
    return indices;
  }
  void RefreshActiveLocked();
  void SampleLocked();
  void SamplerLoop();
  void RequestSample();
  void PublishCountsLocked();
  WorkloadView ViewOf(WorkloadStatus status) const;
  std::optional<std::vector<size_t>> ChooseGpusLocked(const LaunchRequest& request,
                                                      AgentError& error) const;
};

void AgentCore::State::PublishCountsLocked() {
  std::lock_guard lock(metrics_mutex);
  active_workloads = static_cast<int64_t>(active.size());
}

// Drops the workloads that ended (their GPUs become free) and notes the pids of new ones.
void AgentCore::State::RefreshActiveLocked() {
  for (auto entry = active.begin(); entry != active.end();) {
    Holding& holding = entry->second;
    if (holding.launching) {
      ++entry;
      continue;
    }
    auto status = executor->Get(entry->first);
    if (status.ok() && HoldsGpus(status.value().state)) {
      holding.pid = status.value().pid;
      ++entry;
      continue;
    }
    const std::string how = status.ok() ? DescribeEnd(status.value()) : status.error();
    Log(fmt::format("workload {} {}; GPUs {} are free", entry->first, how,
                    JoinIndices(IndicesOf(holding.positions))));
    entry = active.erase(entry);
  }
  PublishCountsLocked();
}

void AgentCore::State::SampleLocked() {
  const auto cycle_start = std::chrono::steady_clock::now();
  const TimeMs now = WallClockMs();
  const size_t count = inventory.gpus.size();
  std::vector<std::vector<std::string>> workload_ids(count);
  std::vector<std::vector<std::string>> job_ids(count);
  std::vector<std::vector<GpuMetricsEntry::Share>> shares(count);
  std::vector<SimGpuLoad> loads(count);
  {
    std::lock_guard lock(mutex);
    RefreshActiveLocked();
    for (const auto& [id, holding] : active) {
      for (size_t position : holding.positions) {
        workload_ids[position].push_back(id);
        job_ids[position].push_back(holding.job_label);
        if (holding.gpu_milli < kMilliPerGpu) {
          const GpuShareLimits limits =
              ShareLimits(holding.gpu_milli, {inventory.gpus[position].memory_total_mib});
          shares[position].push_back(
              {holding.job_label, limits.compute_percent, limits.memory_limit_mib.front()});
        }
        // A workload without CUDA cannot really load a simulated GPU: holding one is the load,
        // unless the workload says otherwise (to try idle-GPU detection without GPUs).
        loads[position].utilization =
            std::max(loads[position].utilization, holding.sim_utilization);
        if (holding.pid > 0) loads[position].process_ids.push_back(holding.pid);
      }
    }
  }
  if (sim) {
    sim->AdvanceTo(now);  // loads apply from the model's time: bring it to now first
    for (size_t position = 0; position < count; ++position)
      sim->SetLoad(inventory.gpus[position].index, loads[position]);
  }
  const std::vector<XidEvent> events = backend->PollEvents(now);
  for (const XidEvent& event : events) {
    const std::string_view description = DescribeXid(event.xid);
    Log(fmt::format("GPU {} ({}) reported XID {}{}{}{}", event.gpu_index, event.uuid, event.xid,
                    description.empty() ? "" : ": ", description,
                    tracker.IsApplicationXid(event.xid)
                        ? " (an application error: the GPU stays healthy)"
                        : ""));
  }

  std::vector<GpuView> views(count);
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = hostname;
  snapshot.backend = std::string(backend->Name());
  snapshot.driver_version = driver_version;
  snapshot.gpu_sharing = std::string(GpuSharingModeName(sharing));
  snapshot.gpus.reserve(count);
  int64_t healthy = 0;
  for (size_t position = 0; position < count; ++position) {
    GpuView& view = views[position];
    view.info = inventory.gpus[position];
    view.sample = backend->Sample(view.info.index, now);
    view.health = tracker.Evaluate(view.info, view.sample, events);
    view.workload_ids = std::move(workload_ids[position]);
    view.job_ids = std::move(job_ids[position]);
    healthy += view.health.healthy ? 1 : 0;
    const std::optional<GpuHealth>& before = reported[position];
    if (!before || before->healthy != view.health.healthy ||
        before->Reason() != view.health.Reason()) {
      if (!view.health.healthy)
        Log(fmt::format("GPU {} ({}) is unhealthy: {}", view.info.index, view.info.uuid,
                        view.health.Reason()));
      else if (before)
        Log(fmt::format("GPU {} ({}) is healthy again", view.info.index, view.info.uuid));
      reported[position] = view.health;
    }
    snapshot.gpus.push_back(
        {view.info, view.sample, view.health, view.job_ids, std::move(shares[position])});
  }
  render_buffer.clear();
  AppendPrometheus(snapshot, render_buffer);
  auto text = std::make_shared<const std::string>(render_buffer);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cycle_start).count();
  {
    std::lock_guard lock(mutex);
    latest = std::move(views);
  }
  std::lock_guard lock(metrics_mutex);
  metrics = std::move(text);
  last_sample_ms = now;
  last_cycle_seconds = seconds;
  healthy_gpus = healthy;
}

void AgentCore::State::SamplerLoop() {
  const auto interval = std::chrono::milliseconds(options.sample_interval_ms);
  auto next = std::chrono::steady_clock::now() + interval;
  std::unique_lock lock(wake_mutex);
  for (;;) {
    wake.wait_until(lock, next, [&] { return stopping || sample_requested; });
    if (stopping) break;
    const bool early = sample_requested && std::chrono::steady_clock::now() < next;
    sample_requested = false;
    lock.unlock();
    {
      std::lock_guard sampling(sample_mutex);
      SampleLocked();
    }
    lock.lock();
    if (early) continue;  // an extra sample; the regular ticks stay where they were
    next += interval;
    // After a stall (a slow driver call), skip the missed ticks rather than run them back to back.
    const auto now = std::chrono::steady_clock::now();
    if (next <= now) next = now + interval;
  }
}

void AgentCore::State::RequestSample() {
  if (!options.start_sampler) return;
  {
    std::lock_guard lock(wake_mutex);
    sample_requested = true;
  }
  wake.notify_all();
}

WorkloadView AgentCore::State::ViewOf(WorkloadStatus status) const {
  WorkloadView view;
  {
    std::lock_guard lock(mutex);
    if (auto cached = spec_cache.find(status.id); cached != spec_cache.end())
      view.spec = cached->second;
  }
  if (view.spec.id.empty()) {
    if (auto spec = executor->Spec(status.id); spec.ok()) {
      view.spec = spec.value();
      std::lock_guard lock(mutex);
      spec_cache[status.id] = view.spec;
    }
  }
  view.adopted = adopted_ids.count(status.id) > 0;
  view.status = std::move(status);
  return view;
}

std::optional<std::vector<size_t>> AgentCore::State::ChooseGpusLocked(const LaunchRequest& request,
                                                                      AgentError& error) const {
  const size_t count = inventory.gpus.size();
  std::vector<std::string> holder(count);  // the holders of each GPU, for messages
  std::vector<MilliGpu> used(count, 0);
  for (const auto& [id, holding] : active)
    for (size_t position : holding.positions) {
      holder[position] += holder[position].empty() ? id : ", " + id;
      used[position] += holding.gpu_milli;
    }
  auto unhealthy_reason = [&](size_t position) -> std::string {
    if (position < latest.size() && !latest[position].health.healthy)
      return latest[position].health.Reason();
    return "";
  };
  std::vector<size_t> chosen;
  if (request.gpu_indices) {
    std::set<int32_t> seen;
    for (int32_t index : *request.gpu_indices) {
      auto found = position_of_index.find(index);
      if (found == position_of_index.end()) {
        error = {AgentErrorKind::kBadRequest,
                 fmt::format("no GPU with index {} on this node (it has {})", index,
                             JoinIndices(AllIndices()))};
        return std::nullopt;
      }
      if (!seen.insert(index).second) {
        error = {AgentErrorKind::kBadRequest, fmt::format("GPU {} is listed twice", index)};
        return std::nullopt;
      }
      const size_t position = found->second;
      if (used[position] + request.gpu_milli > kMilliPerGpu) {
        error = {
            AgentErrorKind::kConflict,
            request.gpu_milli < kMilliPerGpu
                ? fmt::format("GPU {} has {}/1000 of its share free, {} asked (held by {})", index,
                              kMilliPerGpu - used[position], request.gpu_milli, holder[position])
                : fmt::format("GPU {} is in use by workload {}", index, holder[position])};
        return std::nullopt;
      }
      if (std::string reason = unhealthy_reason(position); !reason.empty()) {
        error = {AgentErrorKind::kConflict, fmt::format("GPU {} is unhealthy: {}", index, reason)};
        return std::nullopt;
      }
      chosen.push_back(position);
    }
    return chosen;
  }
  const int32_t wanted = request.gpu_count.value_or(0);
  if (wanted == 0) return chosen;
  if (static_cast<size_t>(wanted) > count) {
    error = {AgentErrorKind::kBadRequest,
             fmt::format("asked for {} GPUs; this node has {}", wanted, count)};
    return std::nullopt;
  }
  // Free healthy GPUs by NVLink island. Best fit: the island with the fewest free GPUs that
  // still holds the whole request, so larger islands stay whole for larger requests.
  std::map<int32_t, std::vector<size_t>> free_by_island;
  std::vector<size_t> free;
  std::vector<std::string> unavailable;
  for (size_t position = 0; position < count; ++position) {
    const int32_t index = inventory.gpus[position].index;
    if (!holder[position].empty()) {
      unavailable.push_back(fmt::format("{} in use by {}", index, holder[position]));
    } else if (std::string reason = unhealthy_reason(position); !reason.empty()) {
      unavailable.push_back(fmt::format("{} unhealthy", index));
    } else {
      free.push_back(position);
      free_by_island[inventory.gpus[position].nvlink_island].push_back(position);
    }
  }
  if (free.size() < static_cast<size_t>(wanted)) {
    error = {AgentErrorKind::kConflict,
             fmt::format("asked for {} GPUs but only {} of {} are free and healthy ({})", wanted,
                         free.size(), count, fmt::join(unavailable, "; "))};
    return std::nullopt;
  }
  const std::vector<size_t>* best = nullptr;
  for (const auto& [island, members] : free_by_island)
    if (members.size() >= static_cast<size_t>(wanted) && (!best || members.size() < best->size()))
      best = &members;
  const std::vector<size_t>& pool = best ? *best : free;  // no island fits: lowest indices
  chosen.assign(pool.begin(), pool.begin() + wanted);
  return chosen;
}

AgentResult<std::unique_ptr<AgentCore>> AgentCore::Open(AgentOptions options) {
  namespace fs = std::filesystem;
  auto bad = [](std::string message) {
    return AgentError{AgentErrorKind::kBadRequest, std::move(message)};
  };
  if (options.sample_interval_ms <= 0) return bad("the sampling interval must be positive");
  if (!options.sim_gpus.empty() && !options.sim_profile.empty())
    return bad("--sim-gpus and --sim-profile both describe simulated GPUs: give one");

  auto state = std::make_unique<State>();
  state->tracker = GpuHealthTracker(options.health);
  state->hostname = options.hostname.empty() ? DefaultHostname() : options.hostname;

  if (!options.sim_gpus.empty() || !options.sim_profile.empty()) {
    SimNodeProfile profile;
    try {
      profile = options.sim_profile.empty() ? ParseSimGpusArgument(options.sim_gpus)
                                            : LoadSimNodeProfile(options.sim_profile);
    } catch (const SimSpecError& error) {
      return bad(options.sim_profile.empty()
                     ? fmt::format("--sim-gpus '{}': {}", options.sim_gpus, error.what())
                     : fmt::format("--sim-profile: {}", error.what()));
    } catch (const std::exception& error) {
      return bad(fmt::format("simulated GPUs: {}", error.what()));
    }
    SimOptions sim_options;
    sim_options.seed = options.sim_seed;
    sim_options.uuid_namespace = state->hostname;
    auto sim = std::make_unique<SimGpuBackend>(std::move(profile), sim_options);
    state->sim = sim.get();
    state->backend = std::move(sim);
  } else {
    NvmlBackend::LoadResult loaded = NvmlBackend::Load({options.nvml_library});
    if (!loaded.backend) return AgentError{AgentErrorKind::kInternal, loaded.error};
    if (auto missing = loaded.backend->MissingFunctions(); !missing.empty())
      state->startup_notes.push_back(
          fmt::format("NVML of this driver lacks {} (their metrics are not reported)",
                      fmt::join(missing, ", ")));
    state->backend = std::move(loaded.backend);
  }
  state->driver_version = state->backend->DriverVersion();
  state->inventory = state->backend->Discover();
  if (!options.sim_device_dir.empty()) {
    if (!state->sim) return bad("--sim-device-dir is for simulated GPUs (--sim-gpus) only");
    if (auto error = MakeSimDeviceFiles(options.sim_device_dir, state->inventory))
      return bad("--sim-device-dir: " + *error);
  }
  for (const std::string& problem : state->inventory.problems)
    state->startup_notes.push_back("GPU left out: " + problem);
  for (size_t position = 0; position < state->inventory.gpus.size(); ++position)
    state->position_of_index[state->inventory.gpus[position].index] = position;
  state->reported.resize(state->inventory.gpus.size());
  for (const GpuInfo& info : state->inventory.gpus) {
    GpuView view;
    view.info = info;
    state->latest.push_back(std::move(view));
  }

  std::error_code fs_error;
  fs::path data_dir = fs::absolute(options.data_dir, fs_error);
  if (fs_error) return bad(fmt::format("data dir '{}': {}", options.data_dir, fs_error.message()));
  state->data_dir = data_dir.lexically_normal().string();
  if (state->data_dir.size() > 1 && state->data_dir.back() == '/') state->data_dir.pop_back();

  if (options.workload_user == "per-job") {
    state->run_as = State::RunAs::kPerJob;
  } else if (options.workload_user == "mapped") {
    state->run_as = State::RunAs::kMapped;
  } else if (!options.workload_user.empty() && options.workload_user != "agent") {
    auto user = LookUpUser(options.workload_user);
    if (!user) return bad(fmt::format("--workload-user '{}': no such user", options.workload_user));
    state->run_as = State::RunAs::kUser;
    state->named_user = std::move(*user);
  }
  if (state->run_as != State::RunAs::kAgent && ::geteuid() != 0 &&
      !(state->run_as == State::RunAs::kUser && state->named_user.uid == ::geteuid()))
    return bad(
        fmt::format("--workload-user '{}' needs the agent to run as root (it runs as uid "
                    "{})",
                    options.workload_user, ::geteuid()));

  switch (options.workload_isolation) {
    case WorkloadIsolationMode::kNamespace:
      if (::geteuid() != 0)
        return bad(fmt::format(
            "--workload-isolation namespace needs the agent to run as root (it runs as uid {})",
            ::geteuid()));
      state->mount_namespaces = true;
      break;
    case WorkloadIsolationMode::kAuto:
      state->mount_namespaces = ::geteuid() == 0;
      break;
    case WorkloadIsolationMode::kNone:
      break;
  }
  if (!state->mount_namespaces && !state->sim && !state->inventory.gpus.empty())
    state->startup_notes.push_back(
        "workloads share the node's /tmp and see every GPU's device file (no mount namespaces: "
        "the agent is not root or --workload-isolation none); CUDA_VISIBLE_DEVICES alone keeps "
        "them to their GPUs");
  if (state->mount_namespaces && !state->sim)
    for (const GpuInfo& gpu : state->inventory.gpus)
      if (gpu.device_files.empty())
        state->startup_notes.push_back(fmt::format(
            "GPU {}: its device file is unknown (no minor number from NVML): it cannot be "
            "hidden from workloads on other GPUs",
            gpu.index));

  // Shares are enforced where they can be, and the node says which (never silently advisory).
  state->sharing = options.gpu_sharing;
  if (state->sharing == GpuSharingMode::kAuto) {
    if (state->sim)
      state->sharing = GpuSharingMode::kRecorded;
    else if (MpsDaemon::FindControlBinary(options.mps_control))
      state->sharing = GpuSharingMode::kMps;
    else
      state->sharing = GpuSharingMode::kAdvisory;
    if (state->sharing == GpuSharingMode::kAdvisory)
      state->startup_notes.push_back(fmt::format(
          "GPU shares are advisory: {} not found (fractional jobs are told their share, nothing "
          "enforces it)",
          options.mps_control));
  }
  if (state->sharing == GpuSharingMode::kMps) {
    if (!MpsDaemon::FindControlBinary(options.mps_control))
      return bad(fmt::format("--gpu-sharing mps: {} not found in PATH", options.mps_control));
    state->mps = std::make_unique<MpsDaemon>(state->data_dir + "/mps", options.mps_control);
  }

  std::vector<std::string> shim_command = options.shim_command;
  if (shim_command.empty()) {
    std::error_code link_error;
    fs::path self = fs::read_symlink("/proc/self/exe", link_error);
    if (link_error)
      return AgentError{
          AgentErrorKind::kInternal,
          fmt::format("find this program's path (/proc/self/exe): {}", link_error.message())};
    shim_command = {self.string(), "agent-shim"};
  }
  ExecutorConfig executor_config;
  executor_config.data_dir = state->data_dir;
  executor_config.shim_command = std::move(shim_command);
  executor_config.cgroup_mode = options.cgroup_mode;
  {
    ContainerRuntimeOptions runtime_options;
    runtime_options.runtime = options.oci_runtime;
    runtime_options.init = options.container_init;
    ContainerRuntimeConfig& containers = executor_config.containers;
    containers = DetectContainerRuntime(runtime_options);
    containers.images.dir =
        options.image_cache_dir.empty() ? state->data_dir + "/images" : options.image_cache_dir;
    containers.images.max_bytes = options.image_cache_max_bytes;
    containers.images.podman = options.podman;
    containers.cdi_dirs = {"/etc/cdi"};
    if (options.cdi_dir != "/etc/cdi") containers.cdi_dirs.push_back(options.cdi_dir);
    if (containers.available()) {
      if (::geteuid() != 0) {
        containers.runtime.clear();
        containers.runtime_description = "none: containers need the agent to run as root";
      } else if (auto error = WriteCdiSpec(options.cdi_dir, state->hostname, state->inventory)) {
        state->startup_notes.push_back("containers get no GPU devices: " + *error);
      } else {
        state->cdi_spec_path = CdiSpecPath(options.cdi_dir, state->hostname);
      }
    }
    state->containers = containers;
  }
  auto executor = Executor::Open(std::move(executor_config));
  if (!executor.ok()) {
    const bool locked = executor.error().find("in use by another executor") != std::string::npos;
    return AgentError{
        locked ? AgentErrorKind::kConflict : AgentErrorKind::kInternal,
        locked ? fmt::format("{}: is another gpufleet agent running over it? Stop it or pass "
                             "another --data-dir",
                             executor.error())
               : executor.error()};
  }
  state->executor = std::move(executor.value());
  if (!state->executor->cgroup_warning().empty())
    state->startup_notes.push_back("no cpu/memory limits: " + state->executor->cgroup_warning());

  // Workloads started by an earlier agent over this data dir keep their GPUs.
  for (const WorkloadStatus& status : state->executor->adopted()) {
    state->adopted_ids.insert(status.id);
    if (!HoldsGpus(status.state)) continue;
    auto spec = state->executor->Spec(status.id);
    if (!spec.ok()) {
      state->startup_notes.push_back(
          fmt::format("adopted workload {}: {}; its GPUs are unknown", status.id, spec.error()));
      continue;
    }
    State::Holding holding;
    holding.pid = status.pid;
    holding.job_label = spec.value().job_id != 0 ? std::to_string(spec.value().job_id) : status.id;
    holding.gpu_milli = spec.value().gpu_milli;
    holding.sim_utilization = SimUtilizationOf(spec.value().env);
    for (int32_t index : spec.value().gpu_indices) {
      auto found = state->position_of_index.find(index);
      if (found == state->position_of_index.end())
        state->startup_notes.push_back(fmt::format(
            "adopted workload {} holds GPU {}, which this node no longer has", status.id, index));
      else
        holding.positions.push_back(found->second);
    }
    state->startup_notes.push_back(fmt::format("re-adopted workload {} ({}, pid {}) on GPUs {}",
                                               status.id, WorkloadStateName(status.state),
                                               status.pid, JoinIndices(spec.value().gpu_indices)));
    state->spec_cache[status.id] = spec.value();
    state->active.emplace(status.id, std::move(holding));
  }
  state->options = std::move(options);

  std::unique_ptr<AgentCore> core(new AgentCore(std::move(state)));
  core->SampleNow();  // /metrics and /v1/gpus have data from the first request on
  State& opened = *core->state_;
  if (opened.options.start_sampler) {
    try {
      opened.sampler = std::thread([&opened] { opened.SamplerLoop(); });
    } catch (const std::system_error& error) {
      return AgentError{AgentErrorKind::kInternal,
                        fmt::format("start the sampling thread: {}", error.what())};
    }
  }
  return core;
}

AgentCore::AgentCore(std::unique_ptr<State> state) : state_(std::move(state)) {}

AgentCore::~AgentCore() {
  {
    std::lock_guard lock(state_->wake_mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->sampler.joinable()) state_->sampler.join();
}

std::string_view AgentCore::backend_name() const {
  return state_->backend->Name();
}

GpuSharingMode AgentCore::gpu_sharing() const {
  return state_->sharing;
}

std::optional<WorkloadIsolationMode> ParseWorkloadIsolationMode(std::string_view name) {
  if (name == "auto") return WorkloadIsolationMode::kAuto;
  if (name == "namespace") return WorkloadIsolationMode::kNamespace;
  if (name == "none") return WorkloadIsolationMode::kNone;
  return std::nullopt;
}

std::string AgentCore::DescribeWorkloadIsolation() const {
  if (!state_->mount_namespaces) return "none (shared /tmp, every GPU device file visible)";
  return state_->sim ? "mount namespace (private /tmp, /var/tmp, /dev/shm; simulated GPUs have no "
                       "device files to hide)"
                     : "mount namespace (private /tmp, /var/tmp, /dev/shm; other GPUs' device "
                       "files hidden)";
}

bool AgentCore::mount_namespaces() const {
  return state_->mount_namespaces;
}

std::string AgentCore::DescribeContainers() const {
  const ContainerRuntimeConfig& containers = state_->containers;
  if (!containers.available()) return containers.runtime_description;
  return fmt::format(
      "{}, init {}, images in {} (kept to {} MiB){}", containers.runtime_description,
      containers.init.empty() ? "none" : containers.init, containers.images.dir,
      containers.images.max_bytes / (1024 * 1024),
      state_->cdi_spec_path.empty() ? "" : ", GPUs as CDI devices in " + state_->cdi_spec_path);
}

std::string AgentCore::DescribeWorkloadUser() const {
  switch (state_->run_as) {
    case State::RunAs::kPerJob:
      return fmt::format("per-job users (uid {} + job id)", kPerJobUidBase);
    case State::RunAs::kMapped:
      return "the Unix users named like the jobs' platform users (mapped; never root)";
    case State::RunAs::kUser:
      return fmt::format("user {} (uid {})", state_->named_user.name, state_->named_user.uid);
    case State::RunAs::kAgent:
      break;
  }
  return fmt::format("the agent's user (uid {}{})", ::geteuid(), ::geteuid() == 0 ? ", root" : "");
}

WorkloadIsolation AgentCore::State::IsolationFor(
    const std::vector<size_t>& positions, const std::map<std::string, std::string>& env) const {
  WorkloadIsolation isolation;
  if (!mount_namespaces) return isolation;
  isolation.mount_namespace = true;
  std::set<std::string> own;
  for (size_t position : positions)
    own.insert(inventory.gpus[position].device_files.begin(),
               inventory.gpus[position].device_files.end());
  // A MIG instance's GPU node stays visible to the instances cut from that GPU.
  std::set<std::string> hidden;
  for (const GpuInfo& gpu : inventory.gpus)
    for (const std::string& file : gpu.device_files)
      if (!own.count(file)) hidden.insert(file);
  isolation.hidden_devices.assign(hidden.begin(), hidden.end());
  isolation.keep_visible = PlatformDirsOf(env);
  return isolation;
}

AgentResult<std::optional<WorkloadUser>> AgentCore::State::RunAsFor(
    const LaunchRequest& request) const {
  if (run_as == RunAs::kAgent) return std::optional<WorkloadUser>();
  if (run_as == RunAs::kUser) return std::optional<WorkloadUser>(named_user);
  if (run_as == RunAs::kMapped) {
    // Looked up at each launch: accounts come and go (LDAP/SSSD) while the agent runs.
    const std::string& name = request.platform_user;
    auto refuse = [&](std::string why) {
      return AgentError{AgentErrorKind::kBadRequest,
                        fmt::format("--workload-user mapped: {}", why)};
    };
    if (name.empty()) return refuse("the workload has no platform user to map");
    auto user = LookUpUser(name);
    if (!user)
      return refuse(fmt::format("platform user '{}' has no Unix account on {}", name, hostname));
    if (user->uid == 0)
      return refuse(
          fmt::format("platform user '{}' maps to uid 0 (root), which runs no workloads", name));
    return std::optional<WorkloadUser>(std::move(*user));
  }
  // A job keeps its uid across attempts and nodes (its checkpoints stay its own); a workload
  // without a job (agent run, the local API) gets one from its id.
  const uint64_t key = request.job_id != 0 ? static_cast<uint64_t>(request.job_id)
                                           : std::hash<std::string>{}(request.id);
  WorkloadUser user;
  user.uid = user.gid = kPerJobUidBase + static_cast<uint32_t>(key % kPerJobUids);
  user.name = request.job_id != 0 ? fmt::format("uid {} (job {})", user.uid, request.job_id)
                                  : fmt::format("uid {} (workload {})", user.uid, request.id);
  return std::optional<WorkloadUser>(std::move(user));
}
std::string AgentCore::driver_version() const {
  return state_->driver_version;
}
const std::string& AgentCore::hostname() const {
  return state_->hostname;
}
const std::string& AgentCore::data_dir() const {
  return state_->data_dir;
}
TimeMs AgentCore::sample_interval_ms() const {
  return state_->options.sample_interval_ms;
}
const GpuInventory& AgentCore::inventory() const {
  return state_->inventory;
}
bool AgentCore::simulated() const {
  return state_->sim != nullptr;
}
CgroupVersion AgentCore::cgroup_version() const {
  return state_->executor->cgroup_version();
}
const std::string& AgentCore::cgroup_warning() const {
  return state_->executor->cgroup_warning();
}
const std::vector<WorkloadStatus>& AgentCore::adopted() const {
  return state_->executor->adopted();
}
const std::vector<std::string>& AgentCore::startup_notes() const {
  return state_->startup_notes;
}

std::string AgentCore::DescribeGpus() const {
  std::vector<std::pair<std::string, int>> groups;  // in order of first appearance
  for (const GpuInfo& info : state_->inventory.gpus) {
    std::string name = fmt::format("{} ({})", info.product_name, info.model);
    auto found = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& group) { return group.first == name; });
    if (found == groups.end())
      groups.emplace_back(std::move(name), 1);
    else
      ++found->second;
  }
  if (groups.empty()) return "no GPUs";
  std::vector<std::string> parts;
  for (const auto& [name, count] : groups)
    parts.push_back(fmt::format("{} x {}", count, name));
  return fmt::format("{}", fmt::join(parts, ", "));
}

void AgentCore::SampleNow() {
  std::lock_guard lock(state_->sample_mutex);
  state_->SampleLocked();
}

AgentSnapshot AgentCore::Snapshot() const {
  AgentSnapshot snapshot;
  snapshot.hostname = state_->hostname;
  snapshot.backend = std::string(state_->backend->Name());
  snapshot.driver_version = state_->driver_version;
  snapshot.problems = state_->inventory.problems;
  {
    std::lock_guard lock(state_->mutex);
    snapshot.gpus = state_->latest;
  }
  std::lock_guard lock(state_->metrics_mutex);
  snapshot.last_sample_ms = state_->last_sample_ms;
  return snapshot;
}

bool AgentCore::SamplerHealthy() const {
  if (!state_->options.start_sampler) return true;  // sampled on demand only
  TimeMs last;
  {
    std::lock_guard lock(state_->metrics_mutex);
    last = state_->last_sample_ms;
  }
  return WallClockMs() - last < 3 * state_->options.sample_interval_ms + 1000;
}

std::string AgentCore::MetricsText() const {
  std::shared_ptr<const std::string> gpus;
  TimeMs last_sample_ms;
  double cycle_seconds;
  int64_t healthy;
  int64_t workloads;
  {
    std::lock_guard lock(state_->metrics_mutex);
    gpus = state_->metrics;
    last_sample_ms = state_->last_sample_ms;
    cycle_seconds = state_->last_cycle_seconds;
    healthy = state_->healthy_gpus;
    workloads = state_->active_workloads;
  }
  const std::string host = EscapeLabelValue(state_->hostname);
  const int64_t total = static_cast<int64_t>(state_->inventory.gpus.size());
  std::string text;
  text.reserve((gpus ? gpus->size() : 0) + 1024);
  if (gpus) text += *gpus;
  fmt::format_to(
      std::back_inserter(text),
      "# HELP gpufleet_agent_healthy 1 when the agent samples its GPUs on time, else 0.\n"
      "# TYPE gpufleet_agent_healthy gauge\n"
      "gpufleet_agent_healthy{{Hostname=\"{0}\"}} {1}\n"
      "# HELP gpufleet_agent_last_sample_timestamp_seconds When the GPUs were last sampled.\n"
      "# TYPE gpufleet_agent_last_sample_timestamp_seconds gauge\n"
      "gpufleet_agent_last_sample_timestamp_seconds{{Hostname=\"{0}\"}} {2:.3f}\n"
      "# HELP gpufleet_agent_sample_duration_seconds How long the last sampling cycle took.\n"
      "# TYPE gpufleet_agent_sample_duration_seconds gauge\n"
      "gpufleet_agent_sample_duration_seconds{{Hostname=\"{0}\"}} {3:.6f}\n"
      "# HELP gpufleet_agent_gpus GPUs of this node by health.\n"
      "# TYPE gpufleet_agent_gpus gauge\n"
      "gpufleet_agent_gpus{{Hostname=\"{0}\",state=\"healthy\"}} {4}\n"
      "gpufleet_agent_gpus{{Hostname=\"{0}\",state=\"unhealthy\"}} {5}\n"
      "# HELP gpufleet_agent_workloads Workloads on this node that have not ended.\n"
      "# TYPE gpufleet_agent_workloads gauge\n"
      "gpufleet_agent_workloads{{Hostname=\"{0}\"}} {6}\n",
      host, SamplerHealthy() ? 1 : 0, static_cast<double>(last_sample_ms) / 1000.0, cycle_seconds,
      healthy, total - healthy, workloads);
  return text;
}

std::optional<std::string> AgentCore::State::HoldToShare(MilliGpu share,
                                                         const std::vector<size_t>& positions,
                                                         WorkloadSpec& spec) {
  std::vector<MiB> memory;
  for (size_t position : positions)
    memory.push_back(inventory.gpus[position].memory_total_mib);
  const GpuShareLimits limits = ShareLimits(share, memory);
  spec.gpu_sharing = std::string(GpuSharingModeName(sharing));
  spec.gpu_compute_percent = limits.compute_percent;
  spec.gpu_memory_limit_mib = limits.memory_limit_mib;
  // Told in any mode, e.g. for torch.cuda.set_per_process_memory_fraction (docs/agent.md).
  spec.env["GPUFLEET_GPU_SHARE"] = fmt::format("{:.3f}", share / 1000.0);
  spec.env["GPUFLEET_GPU_MEMORY_LIMIT_MIB"] = std::to_string(
      *std::min_element(limits.memory_limit_mib.begin(), limits.memory_limit_mib.end()));
  spec.env["GPUFLEET_GPU_SHARING"] = spec.gpu_sharing;
  if (sharing == GpuSharingMode::kAdvisory) return std::nullopt;
  // What the CUDA driver of an MPS client reads at its first CUDA call: recorded as such on
  // simulated GPUs, where nothing reads them.
  spec.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(limits.compute_percent);
  spec.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = PinnedMemoryLimitValue(limits.memory_limit_mib);
  if (sharing != GpuSharingMode::kMps) return std::nullopt;
  if (auto error = mps->EnsureRunning()) return error;
  spec.env["CUDA_MPS_PIPE_DIRECTORY"] = mps->pipe_directory();
  spec.env["CUDA_MPS_LOG_DIRECTORY"] = mps->log_directory();
  return std::nullopt;
}

AgentResult<WorkloadView> AgentCore::Launch(const LaunchRequest& request) {
  State& state = *state_;
  auto bad = [](std::string message) {
    return AgentError{AgentErrorKind::kBadRequest, std::move(message)};
  };
  if (request.argv.empty() || request.argv[0].empty())
    return bad("argv is empty: no command to run");
  if (request.gpu_count && request.gpu_indices)
    return bad("give the GPUs as a count or as indices, not both");
  if (request.gpu_count && *request.gpu_count < 0) return bad("the GPU count is negative");
  if (request.gpu_milli <= 0 || request.gpu_milli > kMilliPerGpu)
    return bad(fmt::format("a GPU share must be 1..1000 thousandths, not {}", request.gpu_milli));
  if (request.gpu_milli < kMilliPerGpu && !request.gpu_indices)
    return bad("a GPU share needs the GPU indices to share");
  const std::string id = request.id.empty() ? NewWorkloadId() : request.id;

  std::vector<size_t> positions;
  {
    std::lock_guard lock(state.mutex);
    state.RefreshActiveLocked();
    if (state.active.count(id))
      return AgentError{AgentErrorKind::kConflict,
                        fmt::format("a workload with id '{}' is already running", id)};
    AgentError error;
    auto chosen = state.ChooseGpusLocked(request, error);
    if (!chosen) return error;
    positions = std::move(*chosen);
    State::Holding holding;
    holding.positions = positions;
    holding.gpu_milli = request.gpu_milli;
    holding.job_label = request.job_id != 0 ? std::to_string(request.job_id) : id;
    holding.sim_utilization = SimUtilizationOf(request.env);
    holding.launching = true;  // the executor does not know it yet: keep the reservation
    state.active.emplace(id, std::move(holding));
    state.PublishCountsLocked();
  }

  WorkloadSpec spec;
  spec.id = id;
  spec.job_id = request.job_id;
  spec.task_index = request.task_index;
  spec.argv = request.argv;
  spec.env = request.env;
  spec.workdir = request.workdir;
  for (size_t position : positions) {
    spec.gpu_indices.push_back(state.inventory.gpus[position].index);
    spec.gpu_uuids.push_back(state.inventory.gpus[position].uuid);
  }
  spec.gpu_milli = request.gpu_milli;
  if (request.gpu_milli < kMilliPerGpu && !positions.empty()) {
    if (auto error = state.HoldToShare(request.gpu_milli, positions, spec)) {
      std::lock_guard lock(state.mutex);
      state.active.erase(id);
      state.PublishCountsLocked();
      return AgentError{AgentErrorKind::kInternal, *error};
    }
  }
  auto run_as = state.RunAsFor(request);
  if (!run_as.ok()) {
    std::lock_guard lock(state.mutex);
    state.active.erase(id);
    state.PublishCountsLocked();
    return run_as.error();
  }
  spec.run_as = std::move(run_as.value());
  if (spec.run_as) {
    // The job's checkpoint directory is its own: the same uid on every attempt, closed to others.
    auto checkpoint = spec.env.find("GPUFLEET_CHECKPOINT_DIR");
    if (checkpoint != spec.env.end() &&
        (::chown(checkpoint->second.c_str(), spec.run_as->uid, spec.run_as->gid) != 0 ||
         ::chmod(checkpoint->second.c_str(), 0700) != 0)) {
      const std::string error =
          fmt::format("give the checkpoint directory {} to {}: {}", checkpoint->second,
                      spec.run_as->name, std::strerror(errno));
      std::lock_guard lock(state.mutex);
      state.active.erase(id);
      state.PublishCountsLocked();
      return AgentError{AgentErrorKind::kInternal, error};
    }
  }
  spec.isolation = state.IsolationFor(positions, spec.env);
  spec.container = request.container;
  if (!spec.container.image.empty()) {
    // The runtime gives it namespaces of its own; what the platform hands it by path (its
    // checkpoint directory) is bound in at that path.
    spec.isolation = WorkloadIsolation();
    spec.isolation.keep_visible = PlatformDirsOf(spec.env);
    if (spec.run_as && !spec.container.user.empty()) {
      std::lock_guard lock(state.mutex);
      state.active.erase(id);
      state.PublishCountsLocked();
      return AgentError{AgentErrorKind::kBadRequest,
                        fmt::format("the job asks for user '{}' in its container, but this node "
                                    "runs workloads as {}",
                                    spec.container.user, DescribeWorkloadUser())};
    }
    for (size_t position : positions)
      spec.cdi_devices.push_back(CdiGpuName(state.inventory.gpus[position]));
  }
  spec.cpu_milli = request.cpu_milli;
  spec.memory_mib = request.memory_mib;
  spec.grace_period = request.grace_period_ms;
  spec.max_runtime = request.max_runtime_ms;
  spec.logs = state.options.workload_logs;

  auto launched = state.executor->Launch(spec);
  std::lock_guard lock(state.mutex);
  if (!launched.ok()) {
    state.active.erase(id);
    state.PublishCountsLocked();
    const std::string& message = launched.error();
    AgentErrorKind kind = AgentErrorKind::kInternal;
    if (message.rfind("invalid workload spec", 0) == 0)
      kind = AgentErrorKind::kBadRequest;
    else if (message.find("already exists") != std::string::npos)
      kind = AgentErrorKind::kConflict;
    return AgentError{kind, message};
  }
  const WorkloadStatus& status = launched.value();
  state.spec_cache[id] = spec;
  auto holding = state.active.find(id);
  if (HoldsGpus(status.state)) {
    holding->second.launching = false;
    holding->second.pid = status.pid;
    state.Log(fmt::format("workload {} {} on GPUs {} (pid {}): {}", id,
                          WorkloadStateName(status.state), JoinIndices(spec.gpu_indices),
                          status.pid, fmt::join(spec.argv, " ")));
  } else {
    state.active.erase(holding);
    state.Log(fmt::format("workload {} {}", id, DescribeEnd(status)));
  }
  state.PublishCountsLocked();
  // /metrics and /v1/gpus show the new holder (and the simulated load) without waiting a tick.
  state.RequestSample();
  WorkloadView view;
  view.status = status;
  view.spec = std::move(spec);
  return view;
}

AgentResult<WorkloadView> AgentCore::Get(const std::string& id) const {
  auto status = state_->executor->Get(id);
  if (!status.ok()) return AgentError{AgentErrorKind::kNotFound, status.error()};
  return state_->ViewOf(std::move(status.value()));
}

std::vector<WorkloadView> AgentCore::List() const {
  std::vector<WorkloadView> views;
  for (WorkloadStatus& status : state_->executor->List())
    views.push_back(state_->ViewOf(std::move(status)));
  return views;
}

AgentResult<WorkloadView> AgentCore::Cancel(const std::string& id, std::optional<TimeMs> grace_ms) {
  if (grace_ms && *grace_ms < 0)
    return AgentError{AgentErrorKind::kBadRequest, "the grace period is negative"};
  auto before = state_->executor->Get(id);
  if (!before.ok()) return AgentError{AgentErrorKind::kNotFound, before.error()};
  auto status = state_->executor->Cancel(id, grace_ms);
  if (!status.ok()) return AgentError{AgentErrorKind::kInternal, status.error()};
  if (!before.value().Finished())
    state_->Log(grace_ms ? fmt::format("cancelling workload {} (grace period {} ms)", id, *grace_ms)
                         : fmt::format("cancelling workload {}", id));
  return state_->ViewOf(std::move(status.value()));
}

AgentResult<std::string> AgentCore::Logs(const std::string& id, std::string_view stream,
                                         std::optional<int64_t> tail_lines) const {
  if (stream != "stdout" && stream != "stderr")
    return AgentError{AgentErrorKind::kBadRequest,
                      fmt::format("unknown log stream '{}' (stdout or stderr)", stream)};
  if (tail_lines && *tail_lines < 0)
    return AgentError{AgentErrorKind::kBadRequest, "tail must not be negative"};
  auto view = Get(id);
  if (!view.ok()) return view.error();
  const WorkloadStatus& status = view.value().status;
  const std::string live = stream == "stdout" ? status.stdout_log : status.stderr_log;
  if (live.empty()) return std::string();
  // Newest first: the live file, then stdout.log.1, .2, ... (rotated files are kept whole).
  const int32_t keep = view.value().spec.logs.keep_files;
  std::string text;
  int64_t budget = kMaxLogBytes;
  for (int32_t file = 0; file <= keep && budget > 0; ++file) {
    const std::string path = file == 0 ? live : RotatingLogFile::RotatedPath(live, file);
    if (file > 0 && ::access(path.c_str(), F_OK) != 0) break;
    std::string chunk = ReadFileTail(path, budget);
    budget -= static_cast<int64_t>(chunk.size());
    text.insert(0, chunk);
    if (tail_lines && CountLines(text) > *tail_lines) break;
  }
  if (tail_lines) return LastLines(text, *tail_lines);
  return text;
}

AgentResult<LogChunk> AgentCore::LogsFrom(const std::string& id, std::string_view stream,
                                          int64_t offset, int64_t max_bytes) const {
  if (stream != "stdout" && stream != "stderr")
    return AgentError{AgentErrorKind::kBadRequest,
                      fmt::format("unknown log stream '{}' (stdout or stderr)", stream)};
  if (offset < 0) return AgentError{AgentErrorKind::kBadRequest, "offset must not be negative"};
  // The state is read before the files: a workload that had ended then has all its output in
  // them (the shim drains its pipes before recording the end), so "finished" is never early.
  auto view = Get(id);
  if (!view.ok()) return view.error();
  const WorkloadStatus& status = view.value().status;
  const bool ended = status.Finished() || status.state == WorkloadState::kLost;
  const std::string live = stream == "stdout" ? status.stdout_log : status.stderr_log;
  LogChunk chunk;
  if (live.empty()) {
    chunk.offset = chunk.next_offset = offset;
    chunk.finished = ended;
    return chunk;
  }
  // Without a readable spec the default keeps at most this many rotated files; probing further
  // stops at the first missing one anyway.
  const int32_t keep =
      view.value().spec.id.empty() ? LogLimits{}.keep_files : view.value().spec.logs.keep_files;
  LogRange range = ReadLogRange(live, keep, offset, std::min(max_bytes, kMaxLogChunkBytes));
  chunk.data = std::move(range.data);
  chunk.offset = range.offset;
  chunk.next_offset = range.next_offset;
  chunk.skipped = range.skipped;
  chunk.finished = ended && range.next_offset >= range.end;
  return chunk;
}

std::optional<AgentError> AgentCore::Forget(const std::string& id) {
  if (auto status = state_->executor->Get(id); !status.ok())
    return AgentError{AgentErrorKind::kNotFound, status.error()};
  if (auto error = state_->executor->Forget(id))
    return AgentError{AgentErrorKind::kConflict, *error};
  std::lock_guard lock(state_->mutex);
  state_->spec_cache.erase(id);
  state_->active.erase(id);
  state_->PublishCountsLocked();
  return std::nullopt;
}

AgentResult<GpuView> AgentCore::InjectFault(const SimFault& fault) {
  State& state = *state_;
  if (!state.sim)
    return AgentError{AgentErrorKind::kConflict,
                      fmt::format("fault injection needs simulated GPUs (--sim-gpus); this agent "
                                  "uses the {} backend",
                                  state.backend->Name())};
  std::lock_guard sampling(state.sample_mutex);
  if (auto error = state.sim->ApplyFault(fault))
    return AgentError{AgentErrorKind::kBadRequest, *error};
  auto found = state.position_of_index.find(fault.gpu);
  if (found == state.position_of_index.end())
    return AgentError{AgentErrorKind::kBadRequest, fmt::format("no GPU with index {}", fault.gpu)};
  const GpuInfo& info = state.inventory.gpus[found->second];
  // A simulated reset returns the GPU to service: the sticky XID and ECC verdicts go too.
  if (fault.kind == SimFaultKind::kClear) state.tracker.ClearSticky(info.uuid);
  state.Log(fmt::format("injected fault {} (code {}) on GPU {} ({})", Name(fault.kind), fault.code,
                        fault.gpu, info.uuid));
  state.SampleLocked();
  std::lock_guard lock(state.mutex);
  return state.latest[found->second];
}

}  // namespace gpufleet::agent
