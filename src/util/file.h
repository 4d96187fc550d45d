// Whole-file reads and atomic writes (nothing a user saved is half-written:
// the bytes go to a temporary file beside the target, then a rename).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "util/error.h"

namespace tern {

inline void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp{}", ::getpid());
  // POSIX I/O for fsync: the bytes reach the disk before the rename makes
  // them the file (a power loss leaves the old file or the new one).
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)));
  std::size_t done = 0;
  bool ok = true;
  while (ok && done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  const int err = ok ? 0 : errno;
  ok = ok && ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(err ? err : errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code removed;  // keep the rename's reason for the message
    std::filesystem::remove(tmp, removed);
    throw Error(fmt::format("cannot write {}: {}", path.string(), ec.message()));
  }
}

// Makes folder `dir` (and its parents) and checks that files can be written
// in it; `what` names it in the error ("--ckpt-dir runs/x: ...").
inline void ensure_writable_dir(const std::filesystem::path& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error(fmt::format("{} {}: exists and is not a folder", what, dir.string()));
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(
        fmt::format("{} {}: cannot create the folder: {}", what, dir.string(), ec.message()));
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(
        fmt::format("{} {}: cannot write in it: {}", what, dir.string(), std::strerror(errno)));
}

// Checks, without touching it, that `file` can be written: not a folder,
// its folder exists and is writable. `what` names it in the error.
inline void check_writable_file(const std::filesystem::path& file, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(file, ec))
    throw Error(fmt::format("{} {}: is a folder, not a file", what, file.string()));
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format("{} {}: folder {} does not exist", what, file.string(), dir.string()));
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(fmt::format("{} {}: cannot write in {}: {}", what, file.string(), dir.string(),
                            std::strerror(errno)));
}

// The host's physical memory (bytes): no file larger than this is read.
inline std::int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : INT64_MAX;
}

// The whole of a regular file. A folder, a device or a FIFO, a file larger
// than the host's memory, or a read error is a tern::Error naming the path.
inline std::string read_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw Error(fmt::format("cannot read {}: {}", path.string(),
                            ec ? ec.message() : std::string("no such file")));
  if (fs::is_directory(st)) throw Error(fmt::format("{} is a folder, not a file", path.string()));
  if (!fs::is_regular_file(st))
    throw Error(fmt::format("{} is not a regular file (a device or a pipe)", path.string()));
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > static_cast<std::uintmax_t>(host_memory_bytes()))
    throw Error(fmt::format("{}: {} bytes, more than this host's memory", path.string(), size));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("cannot read {}: a read error", path.string()));
  return s.str();
}

}  // namespace tern
