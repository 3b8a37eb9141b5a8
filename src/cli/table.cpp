#include "cli/table.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include <fmt/format.h>

namespace gpufleet::cli {
namespace {

bool IsContinuationByte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

// Drops trailing zeros of a fixed-point number: "1.50" -> "1.5", "2.00" -> "2".
std::string TrimZeros(std::string text) {
  if (text.find('.') == std::string::npos) return text;
  while (text.back() == '0')
    text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::Add(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  for (size_t i = 0; i < cells.size(); ++i)
    cells[i] =
        Truncate(cells[i], columns_[i].max_width == 0 ? std::string::npos : columns_[i].max_width);
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> widths(columns_.size());
  for (size_t i = 0; i < columns_.size(); ++i) {
    widths[i] = DisplayWidth(columns_[i].header);
    for (const auto& row : rows_)
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
  }
  std::string out;
  auto add_line = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
      const size_t pad = widths[i] - DisplayWidth(cells[i]);
      if (i > 0) line += "  ";
      if (columns_[i].right) line.append(pad, ' ');
      line += cells[i];
      if (!columns_[i].right) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    out += line;
    out += '\n';
  };
  std::vector<std::string> headers;
  for (const Column& column : columns_)
    headers.push_back(column.header);
  add_line(headers);
  for (const auto& row : rows_)
    add_line(row);
  return out;
}

size_t DisplayWidth(std::string_view text) {
  return static_cast<size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return !IsContinuationByte(c); }));
}

std::string Truncate(std::string_view text, size_t width) {
  std::string flat(text);
  for (char& c : flat)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (DisplayWidth(flat) <= width) return flat;
  constexpr std::string_view kEllipsis = "...";
  if (width <= kEllipsis.size()) return std::string(kEllipsis.substr(0, width));
  // Keep whole code points: cut before the (width - 3)th one.
  size_t kept = 0;
  size_t end = 0;
  while (end < flat.size()) {
    if (!IsContinuationByte(flat[end])) {
      if (kept == width - kEllipsis.size()) break;
      ++kept;
    }
    ++end;
  }
  return flat.substr(0, end) + std::string(kEllipsis);
}

std::string FormatAge(TimeMs then_ms, TimeMs now_ms) {
  if (then_ms <= 0) return "-";
  const int64_t seconds = std::max<int64_t>(0, (now_ms - then_ms) / 1000);
  const int64_t minutes = seconds / 60;
  const int64_t hours = minutes / 60;
  const int64_t days = hours / 24;
  // Precise while it is recent, coarser as it ages: the two leading units up to ten of the
  // larger one, then just the larger one.
  if (seconds < 120) return fmt::format("{}s", seconds);
  if (minutes < 10)
    return seconds % 60 == 0 ? fmt::format("{}m", minutes)
                             : fmt::format("{}m{}s", minutes, seconds % 60);
  if (hours < 3) return fmt::format("{}m", minutes);
  if (hours < 10)
    return minutes % 60 == 0 ? fmt::format("{}h", hours)
                             : fmt::format("{}h{}m", hours, minutes % 60);
  if (days < 2) return fmt::format("{}h", hours);
  if (days < 8)
    return hours % 24 == 0 ? fmt::format("{}d", days) : fmt::format("{}d{}h", days, hours % 24);
  if (days < 730) return fmt::format("{}d", days);
  return fmt::format("{}y", days / 365);
}

std::string FormatDuration(TimeMs ms) {
  if (ms <= 0) return "0s";
  if (ms % 1000 != 0)
    return ms < 1000 ? fmt::format("{}ms", ms)
                     : TrimZeros(fmt::format("{:.3f}", static_cast<double>(ms) / 1000)) + "s";
  int64_t seconds = ms / 1000;
  std::string text;
  if (seconds >= 3600) {
    text += fmt::format("{}h", seconds / 3600);
    seconds %= 3600;
  }
  if (seconds >= 60) {
    text += fmt::format("{}m", seconds / 60);
    seconds %= 60;
  }
  if (seconds > 0) text += fmt::format("{}s", seconds);
  return text;
}

std::string FormatTime(TimeMs epoch_ms) {
  if (epoch_ms <= 0) return "-";
  const std::time_t seconds = static_cast<std::time_t>(epoch_ms / 1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", &local);
  return buffer;
}

std::string FormatMemory(MiB mib) {
  constexpr MiB kGi = 1024;
  constexpr MiB kTi = 1024 * 1024;
  if (mib > 0 && mib % kTi == 0) return fmt::format("{}Ti", mib / kTi);
  if (mib > 0 && mib % kGi == 0) return fmt::format("{}Gi", mib / kGi);
  // Below 10 Gi exact MiB say more than a rounded Gi; above, node sizes read better rounded.
  if (mib < 10 * kGi) return fmt::format("{}Mi", mib);
  return TrimZeros(fmt::format("{:.1f}", static_cast<double>(mib) / kGi)) + "Gi";
}

std::string FormatCpu(MilliCpu milli) {
  if (milli % 1000 == 0) return fmt::format("{}", milli / 1000);
  if (milli < 1000) return fmt::format("{}m", milli);
  return TrimZeros(fmt::format("{:.3f}", static_cast<double>(milli) / 1000));
}

std::string FormatGpuCount(MilliGpu milli) {
  std::string number =
      milli % kMilliPerGpu == 0
          ? fmt::format("{}", milli / kMilliPerGpu)
          : TrimZeros(fmt::format("{:.3f}", static_cast<double>(milli) / kMilliPerGpu));
  return number + (milli > 0 && milli <= kMilliPerGpu ? " GPU" : " GPUs");
}

TimeMs NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace gpufleet::cli
