#include "sim/csv.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "sim/trace.h"

namespace gpufleet::sim {
namespace {

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

FilePtr OpenForReading(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw TraceError(fmt::format("{}:0: cannot open: {}", path, std::strerror(errno)));
  return file;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

// Howard Hinnant's days_from_civil: days since 1970-01-01 in the proleptic Gregorian calendar.
int64_t DaysFromCivil(int64_t year, int64_t month, int64_t day) {
  year -= month <= 2 ? 1 : 0;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;
  const int64_t day_of_year = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

int64_t DaysInMonth(int64_t year, int64_t month) {
  static constexpr int64_t kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

// The value of `count` decimal digits at text[at], or -1 when one of them is not a digit.
int64_t Digits(std::string_view text, size_t at, size_t count) {
  int64_t value = 0;
  for (size_t i = at; i < at + count; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

}  // namespace

std::string ReadWholeFile(const std::string& path) {
  FilePtr file = OpenForReading(path);
  std::string text;
  std::error_code size_error;
  const auto size = std::filesystem::file_size(path, size_error);
  if (!size_error) text.reserve(size);
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0)
    text.append(buffer, got);
  if (std::ferror(file.get()))
    throw TraceError(fmt::format("{}:0: cannot read: {}", path, std::strerror(errno)));
  return text;
}

std::string ReadFirstLine(const std::string& path) {
  FilePtr file = OpenForReading(path);
  std::string line;
  for (int c = std::fgetc(file.get()); c != EOF && c != '\n'; c = std::fgetc(file.get()))
    line.push_back(static_cast<char>(c));
  if (std::ferror(file.get()))
    throw TraceError(fmt::format("{}:0: cannot read: {}", path, std::strerror(errno)));
  return line;
}

CsvReader::CsvReader(std::string_view text) : text_(text) {
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  if (text_.starts_with(kByteOrderMark)) pos_ = kByteOrderMark.size();
}

bool CsvReader::Next(CsvRecord& record) {
  record.fields.clear();
  record.error.clear();
  unescaped_.clear();

  // Skip blank lines, including a trailing one.
  while (true) {
    size_t end = pos_;
    while (end < text_.size() && IsSpace(text_[end]))
      ++end;
    if (end == text_.size()) {
      pos_ = end;
      return false;
    }
    if (text_[end] != '\n') break;
    pos_ = end + 1;
    ++line_;
  }

  record.line = line_;
  while (true) {
    if (!ReadField(record)) {
      SkipRestOfLine();
      return true;
    }
    if (pos_ == text_.size()) return true;
    const char separator = text_[pos_++];
    if (separator == '\n') {
      ++line_;
      return true;
    }
  }
}

bool CsvReader::ReadField(CsvRecord& record) {
  size_t start = pos_;
  while (start < text_.size() && (text_[start] == ' ' || text_[start] == '\t'))
    ++start;
  if (start < text_.size() && text_[start] == '"') {
    pos_ = start;
    return ReadQuotedField(record);
  }
  size_t end = pos_;
  while (end < text_.size() && text_[end] != ',' && text_[end] != '\n')
    ++end;
  record.fields.push_back(TrimSpaces(text_.substr(pos_, end - pos_)));
  pos_ = end;
  return true;
}

bool CsvReader::ReadQuotedField(CsvRecord& record) {
  ++pos_;  // the opening quote
  const size_t begin = pos_;
  size_t chunk_begin = begin;
  std::string* unescaped = nullptr;  // only fields with doubled quotes need a copy
  while (true) {
    const size_t quote = text_.find('"', pos_);
    if (quote == std::string_view::npos) {
      record.error = "unterminated quoted field";
      pos_ = text_.size();
      return false;
    }
    for (size_t i = pos_; i < quote; ++i)
      line_ += text_[i] == '\n' ? 1 : 0;
    if (quote + 1 < text_.size() && text_[quote + 1] == '"') {
      if (unescaped == nullptr) unescaped = &unescaped_.emplace_back();
      unescaped->append(text_.substr(chunk_begin, quote + 1 - chunk_begin));
      pos_ = quote + 2;
      chunk_begin = pos_;
      continue;
    }
    std::string_view value = text_.substr(begin, quote - begin);
    if (unescaped != nullptr) {
      unescaped->append(text_.substr(chunk_begin, quote - chunk_begin));
      value = *unescaped;
    }
    pos_ = quote + 1;
    while (pos_ < text_.size() && IsSpace(text_[pos_]))
      ++pos_;
    if (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '\n') {
      record.error = "text after the closing quote of a field";
      return false;
    }
    record.fields.push_back(value);
    return true;
  }
}

void CsvReader::SkipRestOfLine() {
  const size_t newline = text_.find('\n', pos_);
  if (newline == std::string_view::npos) {
    pos_ = text_.size();
    return;
  }
  pos_ = newline + 1;
  ++line_;
}

std::string_view TrimSpaces(std::string_view text) {
  while (!text.empty() && IsSpace(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back()))
    text.remove_suffix(1);
  return text;
}

std::optional<int64_t> ParseInt(std::string_view text) {
  text = TrimSpaces(text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> ParseDouble(std::string_view text) {
  text = TrimSpaces(text);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() ||
      !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::optional<int64_t> ParseUtcTimestamp(std::string_view text) {
  text = TrimSpaces(text);
  constexpr std::string_view kShape = "YYYY-MM-DD HH:MM:SS";
  if (text.size() != kShape.size() || text[4] != '-' || text[7] != '-' ||
      (text[10] != ' ' && text[10] != 'T') || text[13] != ':' || text[16] != ':')
    return std::nullopt;
  const int64_t year = Digits(text, 0, 4);
  const int64_t month = Digits(text, 5, 2);
  const int64_t day = Digits(text, 8, 2);
  const int64_t hour = Digits(text, 11, 2);
  const int64_t minute = Digits(text, 14, 2);
  const int64_t second = Digits(text, 17, 2);
  if (year < 0 || month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) ||
      hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 59)
    return std::nullopt;
  return DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
}

}  // namespace gpufleet::sim
