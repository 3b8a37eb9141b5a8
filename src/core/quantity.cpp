#include "core/quantity.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

namespace gpufleet {
namespace {

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

// A non-negative decimal number followed by a unit; nothing when malformed.
std::optional<std::pair<double, std::string_view>> SplitNumber(std::string_view text) {
  text = Trim(text);
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
    ++end;
  if (end == 0) return std::nullopt;
  double value = 0;
  auto [stop, status] = std::from_chars(text.data(), text.data() + end, value);
  if (status != std::errc() || stop != text.data() + end || !std::isfinite(value) || value < 0)
    return std::nullopt;
  return std::pair{value, Trim(text.substr(end))};
}

}  // namespace

std::optional<MiB> ParseMemoryMib(std::string_view text) {
  auto parsed = SplitNumber(text);
  if (!parsed) return std::nullopt;
  const auto [value, unit] = *parsed;
  double mib;
  if (unit.empty() || unit == "Mi" || unit == "MiB")
    mib = value;
  else if (unit == "Gi" || unit == "GiB")
    mib = value * 1024;
  else if (unit == "Ti" || unit == "TiB")
    mib = value * 1024 * 1024;
  else if (unit == "Ki" || unit == "KiB")
    mib = value / 1024;
  else
    return std::nullopt;
  if (mib > 1e15) return std::nullopt;
  return static_cast<MiB>(std::ceil(mib));  // a limit below one MiB still limits
}

std::optional<MilliCpu> ParseCpuMilli(std::string_view text) {
  auto parsed = SplitNumber(text);
  if (!parsed) return std::nullopt;
  const auto [value, unit] = *parsed;
  double milli;
  if (unit.empty())
    milli = value * 1000;
  else if (unit == "m")
    milli = value;
  else
    return std::nullopt;
  if (milli > 1e12) return std::nullopt;
  return static_cast<MilliCpu>(std::llround(milli));
}

std::optional<TimeMs> ParseDurationMs(std::string_view text) {
  auto parsed = SplitNumber(text);
  if (!parsed) return std::nullopt;
  const auto [value, unit] = *parsed;
  double ms;
  if (unit.empty() || unit == "s")
    ms = value * 1000;
  else if (unit == "ms")
    ms = value;
  else if (unit == "m" || unit == "min")
    ms = value * 60'000;
  else if (unit == "h")
    ms = value * 3'600'000;
  else if (unit == "d")
    ms = value * 86'400'000;
  else
    return std::nullopt;
  if (ms > 1e15) return std::nullopt;
  return static_cast<TimeMs>(std::llround(ms));
}

std::optional<MilliGpu> ParseGpuMilli(std::string_view text) {
  auto parsed = SplitNumber(text);
  if (!parsed || !parsed->second.empty()) return std::nullopt;
  const double milli = parsed->first * kMilliPerGpu;
  if (milli > 1e6 || std::fabs(milli - std::round(milli)) > 1e-6) return std::nullopt;
  return static_cast<MilliGpu>(std::llround(milli));
}

}  // namespace gpufleet
