// The tests' one check for a refused input: `f` must throw tern::Error (or
// a subclass: NotSupported, ...) whose message contains every given
// phrase, so a test pins what the user reads, not only that it failed.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "util/error.h"

namespace tern::test_util {

// `words`: any range of strings (all must appear in the message).
template <typename F, typename Words>
void expect_error_words(F&& f, const Words& words) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error containing '"
                  << (std::begin(words) != std::end(words) ? std::string(*std::begin(words))
                                                           : std::string())
                  << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& w : words)
      EXPECT_NE(msg.find(w), std::string::npos) << msg << "\n  lacks: " << w;
  }
}

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string_view> words) {
  expect_error_words(std::forward<F>(f), words);
}

template <typename F>
void expect_error(F&& f, std::string_view words) {
  expect_error_words(std::forward<F>(f), std::initializer_list<std::string_view>{words});
}

}  // namespace tern::test_util
