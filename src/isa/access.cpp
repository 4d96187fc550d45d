#include "isa/access.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "util/checked.h"
#include "util/error.h"

namespace tern::isa {

std::string_view mem_name(Mem m) {
  switch (m) {
    case Mem::hbm:
      return "hbm";
    case Mem::sbuf:
      return "sbuf";
    case Mem::psum:
      return "psum";
  }
  return "?";
}

int AccessPattern::rows() const {
  if (mem == Mem::hbm)
    return dims.empty() ? 1
                        : static_cast<int>(std::clamp<std::int64_t>(dims[0].count, 0, INT32_MAX));
  return partitions;
}

std::int64_t AccessPattern::free_size() const {
  std::int64_t n = 1;
  for (std::size_t i = mem == Mem::hbm ? 1 : 0; i < dims.size(); ++i) n *= dims[i].count;
  return n;
}

std::int64_t AccessPattern::element_offset(std::int64_t i) const {
  std::int64_t off = 0;
  const std::size_t first = mem == Mem::hbm ? 1 : 0;
  for (std::size_t d = dims.size(); d-- > first;) {
    off += (i % dims[d].count) * dims[d].stride;
    i /= dims[d].count;
  }
  return (mem == Mem::hbm ? 0 : offset) + off * size_bytes(dtype);
}

std::int64_t AccessPattern::row_address(int r) const {
  const std::int64_t stride = dims.empty() ? 0 : dims[0].stride;
  return offset + r * stride * size_bytes(dtype);
}

namespace {
// The byte bounds in 128 bits, saturated to int64: a program's offsets and
// strides come from a file, and a wrapped bound would pass the range
// checks (a saturated one never does).
Int128 reach(const AccessPattern& ap, bool up) {
  Int128 b = ap.offset;
  for (const Dim& d : ap.dims) {
    const Int128 span = static_cast<Int128>(d.stride) * (d.count - 1) * size_bytes(ap.dtype);
    b += up ? std::max<Int128>(0, span) : std::min<Int128>(0, span);
  }
  return b;
}
}  // namespace

std::int64_t AccessPattern::min_byte() const {
  return saturate(reach(*this, false));
}

std::int64_t AccessPattern::max_byte() const {
  return saturate(reach(*this, true) + size_bytes(dtype));
}

bool AccessPattern::contiguous_inner() const {
  const std::size_t first = mem == Mem::hbm ? 1 : 0;
  return dims.size() <= first || dims.back().stride == 1;
}

std::int64_t AccessPattern::contiguous_run() const {
  const std::size_t first = mem == Mem::hbm ? 1 : 0;
  std::int64_t run = 1;
  for (std::size_t i = dims.size(); i-- > first;) {
    if (dims[i].count <= 1) continue;
    if (dims[i].stride != run) break;
    run *= dims[i].count;
  }
  return run;
}

AccessPattern resolve(const AccessPattern& ap, std::int64_t reg_value) {
  AccessPattern r = ap;
  // Saturated: a wild register value gives an offset the bounds checks
  // refuse, never one that wrapped back into range.
  if (r.offset_reg >= 0)
    r.offset =
        saturate(static_cast<Int128>(r.offset) + static_cast<Int128>(r.reg_stride) * reg_value);
  r.offset_reg = -1;
  r.reg_stride = 0;
  return r;
}

std::string to_string(const AccessPattern& ap) {
  std::string s(mem_name(ap.mem));
  if (ap.mem != Mem::hbm)
    s += fmt::format("[{}:{}]", ap.start_partition, ap.start_partition + ap.partitions);
  s += fmt::format("+{}", ap.offset);
  if (ap.offset_reg >= 0) s += fmt::format("+r{}*{}", ap.offset_reg, ap.reg_stride);
  s += " [";
  for (std::size_t i = 0; i < ap.dims.size(); ++i) {
    s += fmt::format("{}[{},{}]", i ? "," : "", ap.dims[i].stride, ap.dims[i].count);
  }
  return s + fmt::format("] {}", name(ap.dtype));
}

AccessPattern parse_access(const std::string& text) {
  AccessPattern ap;
  const char* p = text.c_str();
  auto fail = [&](const char* what) -> AccessPattern {
    throw Error(fmt::format("malformed operand '{}': {}", text, what));
  };
  auto skip = [&] {
    while (*p == ' ') ++p;
  };
  auto integer = [&](std::int64_t& v) {
    char* end = nullptr;
    errno = 0;
    v = std::strtoll(p, &end, 10);
    if (end == p) fail("expected a number");
    if (errno == ERANGE) fail("a number outside the 64-bit range");
    p = end;
  };
  auto small = [&](std::int64_t v) {  // partitions and register numbers
    if (v < INT32_MIN || v > INT32_MAX) fail("a partition or register number out of range");
    return static_cast<int>(v);
  };
  skip();
  if (!std::strncmp(p, "hbm", 3)) {
    ap.mem = Mem::hbm;
    p += 3;
  } else if (!std::strncmp(p, "sbuf", 4)) {
    ap.mem = Mem::sbuf;
    p += 4;
  } else if (!std::strncmp(p, "psum", 4)) {
    ap.mem = Mem::psum;
    p += 4;
  } else
    return fail("expected hbm, sbuf or psum");
  std::int64_t v;
  if (ap.mem != Mem::hbm) {
    if (*p++ != '[') return fail("expected [start:end]");
    integer(v);
    ap.start_partition = small(v);
    if (*p++ != ':') return fail("expected ':'");
    integer(v);
    ap.partitions = small(v - ap.start_partition);
    if (*p++ != ']') return fail("expected ']'");
  }
  if (*p++ != '+') return fail("expected +offset");
  integer(ap.offset);
  if (p[0] == '+' && p[1] == 'r') {
    p += 2;
    integer(v);
    ap.offset_reg = small(v);
    if (*p++ != '*') return fail("expected +rN*stride");
    integer(ap.reg_stride);
  }
  skip();
  if (*p++ != '[') return fail("expected a [[stride,count],...] pattern");
  while (*p == '[' || *p == ',') {
    if (*p == ',') ++p;
    if (*p++ != '[') return fail("expected '['");
    Dim d;
    integer(d.stride);
    if (*p++ != ',') return fail("expected ','");
    integer(d.count);
    if (*p++ != ']') return fail("expected ']'");
    ap.dims.push_back(d);
  }
  if (*p++ != ']') return fail("expected ']' closing the pattern");
  skip();
  std::string dt(p);
  while (!dt.empty() && dt.back() == ' ') dt.pop_back();
  ap.dtype = parse_dtype(dt);
  if (ap.mem == Mem::hbm && !ap.dims.empty()) ap.partitions = small(ap.dims[0].count);
  return ap;
}

}  // namespace tern::isa
