#pragma once

// Readers for the public GPU-cluster traces and for a generic CSV job list; the formats and their
// mapping to JobSpec are documented in docs/trace-formats.md.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/cluster.h"
#include "sim/trace.h"

namespace gpufleet::sim {

enum class TraceFormat {
  kItp,          // Microsoft ITP (ElasticFlow): job_id,submission_time,duration,num_gpu
  kPhilly,       // Microsoft Philly (Pollux): timestamp,duration,num_gpus,gpu_time,cluster
  kAlibabaPods,  // Alibaba GPU v2023 (FGD) pod lists: name,cpu_milli,memory_mib,num_gpu,...
  kGeneric,      // our own CSV: submit_time,duration,gpus and optional columns, by name
};

// The names used on the command line: "itp", "philly", "alibaba-pods", "generic".
std::string_view TraceFormatName(TraceFormat format);
std::optional<TraceFormat> ParseTraceFormat(std::string_view name);
// All format names, in the order of the enum.
std::vector<std::string_view> TraceFormatNames();

// Recognises the format from the header line. Throws TraceError ("path:1: ...") when the header
// matches no format, and says so when the file is a node list rather than a trace.
TraceFormat DetectTraceFormat(const std::string& path);

// Reads a trace: jobs sorted by submit time (ties in file order), the earliest submitting at 0,
// spec.id the position in that order. Throws TraceError ("path:line: why") on a malformed header,
// on the first bad row unless options.skip_invalid, and when no row gives a job. Throws
// std::invalid_argument for options out of range.
Trace ReadTrace(const std::string& path, TraceFormat format, const ReadOptions& options = {});
// Same, detecting the format from the header.
Trace ReadTrace(const std::string& path, const ReadOptions& options = {});

// Reads an Alibaba v2023 node list (sn,cpu_milli,memory_mib,gpu,model) as a cluster: one node per
// row in file order, consecutive groups of `nodes_per_rack` nodes per rack and of
// `racks_per_spine` racks per spine. Throws TraceError on the first bad row and
// std::invalid_argument when a group size is below 1.
Cluster ReadAlibabaNodes(const std::string& path, int32_t nodes_per_rack, int32_t racks_per_spine);

// GPU memory of the models in the Alibaba v2023 node lists, or 0 when unknown (G2, G3 and any
// other model).
MiB AlibabaGpuMemoryMib(std::string_view model);

}  // namespace gpufleet::sim
