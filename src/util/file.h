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
    std::filesystem::remove(tmp, ec);
    throw Error(fmt::format("cannot write {}: {}", path.string(), ec.message()));
  }
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot read {}", path.string()));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tern
