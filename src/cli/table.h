#pragma once

// Plain-text tables and the value formats the CLI shows people (ages, sizes, times). Columns are
// as wide as their widest cell, like kubectl's, so output lines up for any data.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::cli {

class Table {
 public:
  struct Column {
    std::string header;
    size_t max_width = 0;  // 0: unlimited; longer cells are cut with "..."
    bool right = false;    // right-aligned (numbers)
  };

  explicit Table(std::vector<Column> columns);
  // One row; missing cells are blank, extra cells are ignored.
  void Add(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }
  // Header and rows, two spaces between columns, no trailing blanks.
  std::string Render() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width in terminal columns (UTF-8 code points; every one counts as one).
size_t DisplayWidth(std::string_view text);
// At most `width` columns: longer text keeps its start and ends in "..."; newlines and tabs
// become spaces so one cell stays on one line.
std::string Truncate(std::string_view text, size_t width);

// How long ago `then_ms` was at `now_ms`, kubectl-style: "45s", "3m20s", "17m", "5h", "3d".
// "-" when then_ms is 0 (never); a time in the future counts as "0s".
std::string FormatAge(TimeMs then_ms, TimeMs now_ms);
// A duration in the units people type: "2h", "1h30m", "45s", "500ms"; "0s" for 0.
std::string FormatDuration(TimeMs ms);
// Local wall-clock time "2024-05-01 14:03:07"; "-" for 0.
std::string FormatTime(TimeMs epoch_ms);
// "16Gi", "512Mi", "1.5Ti" (binary units, as the API reads them).
std::string FormatMemory(MiB mib);
// "4", "0.5", "500m" for milli-CPUs.
std::string FormatCpu(MilliCpu milli);
// "1 GPU", "0.5 GPU", "8 GPUs", "0 GPUs".
std::string FormatGpuCount(MilliGpu milli);

// The current wall clock in ms since the Unix epoch (the API's clock).
TimeMs NowMs();

}  // namespace gpufleet::cli
