#pragma once

// Fast CSV splitting and field parsing for the trace readers: the whole file is read at once and
// records are split in place, so fields are views into the file text and parsing a row allocates
// nothing.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpufleet::sim {

// Reads a whole file. Throws TraceError ("path:0: cannot open ...") when it cannot be read.
std::string ReadWholeFile(const std::string& path);

// Reads the first line of a file (without its line ending), or "" for an empty file. Throws
// TraceError like ReadWholeFile.
std::string ReadFirstLine(const std::string& path);

// One record. The fields view the text given to CsvReader, or the reader's own storage for
// quoted fields with doubled quotes; they stay valid until the reader's next Next().
struct CsvRecord {
  int64_t line = 0;  // 1-based line where the record starts
  std::vector<std::string_view> fields;
  std::string error;  // why the record is malformed (an unterminated quote), else empty
};

// Splits CSV text into records: comma separated, LF or CRLF line endings, RFC 4180 quotes (a
// quoted field may hold commas, newlines and doubled quotes). Blank lines are skipped, a UTF-8
// byte order mark is ignored, and spaces around unquoted fields are trimmed.
class CsvReader {
 public:
  explicit CsvReader(std::string_view text);

  // Reads the next record into `record`; returns false at the end of the text.
  bool Next(CsvRecord& record);

 private:
  // Reads one field starting at pos_; returns false when the record turned out malformed.
  bool ReadField(CsvRecord& record);
  bool ReadQuotedField(CsvRecord& record);
  void SkipRestOfLine();

  std::string_view text_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  std::deque<std::string> unescaped_;  // a deque: growing it keeps earlier strings in place
};

std::string_view TrimSpaces(std::string_view text);

// Strict number parsing: the whole text (after trimming spaces) must be the number; nothing for
// empty text, junk, or values out of range. ParseDouble accepts only finite values.
std::optional<int64_t> ParseInt(std::string_view text);
std::optional<double> ParseDouble(std::string_view text);

// Parses "YYYY-MM-DD HH:MM:SS" (or with 'T' between date and time) as UTC; returns seconds since
// the Unix epoch, or nothing when the text is not such a valid date and time.
std::optional<int64_t> ParseUtcTimestamp(std::string_view text);

}  // namespace gpufleet::sim
