// Errors tern reports to users. Every failure a user can cause (bad input,
// a kernel breaking a hardware rule, an unsupported feature) is one of these,
// with a message that names what and where; the CLI prints it on one line and
// exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace tern {

// Bad input or a violated rule. The message is complete and user-facing.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A feature tern does not implement. The message always starts with
// "not supported: " so users and tests can tell it from a bug.
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& what) : Error("not supported: " + what) {}
};

}  // namespace tern
