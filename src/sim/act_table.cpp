#include "sim/act_table.h"

#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace tern::sim {

namespace {
struct Entry {
  std::size_t asked = 0;
  std::unique_ptr<float[]> table;
};
std::mutex mutex;
std::map<std::tuple<int, std::uint32_t, std::uint32_t>, Entry> entries;
}  // namespace

const float* ActTables::get(isa::ActFunc f, float scale, float bias, std::size_t elements) {
  std::lock_guard lock(mutex);
  Entry& e = entries[{static_cast<int>(f), std::bit_cast<std::uint32_t>(scale),
                      std::bit_cast<std::uint32_t>(bias)}];
  if (e.table) return e.table.get();
  e.asked += elements;
  if (e.asked < kBuildAfter) return nullptr;
  auto t = std::make_unique<float[]>(std::size_t{1} << 16);
  for (std::uint32_t c = 0; c < (1u << 16); ++c)
    t[c] = isa::apply_act(f, std::bit_cast<float>(c << 16) * scale + bias);
  e.table = std::move(t);
  return e.table.get();
}

ActTables& act_tables() {
  static ActTables t;
  return t;
}

}  // namespace tern::sim
