#include "train/plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>

#include <fmt/format.h>
#include <png.h>

#include "util/error.h"
#include "util/file.h"

namespace tern::train {

namespace {

constexpr int kW = 800, kH = 500;
constexpr int kLeft = 70, kRight = 20, kTop = 30, kBottom = 50;

// 5 x 7 glyphs, one byte a row (bit 4 = leftmost pixel).
const std::map<char, std::array<std::uint8_t, 7>>& font() {
  static const std::map<char, std::array<std::uint8_t, 7>> f = {
      {'0', {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e}},
      {'1', {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e}},
      {'2', {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f}},
      {'3', {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e}},
      {'4', {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02}},
      {'5', {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e}},
      {'6', {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e}},
      {'7', {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e}},
      {'9', {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c}},
      {'-', {0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00}},
      {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1f}},
      {':', {0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x0c, 0x00}},
      {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
      {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
      {'/', {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10}},
      {'a', {0x00, 0x00, 0x0e, 0x01, 0x0f, 0x11, 0x0f}},
      {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1e}},
      {'c', {0x00, 0x00, 0x0e, 0x10, 0x10, 0x11, 0x0e}},
      {'d', {0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f}},
      {'e', {0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e}},
      {'f', {0x06, 0x09, 0x08, 0x1c, 0x08, 0x08, 0x08}},
      {'g', {0x00, 0x0f, 0x11, 0x11, 0x0f, 0x01, 0x0e}},
      {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
      {'i', {0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e}},
      {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}},
      {'l', {0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e}},
      {'m', {0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11}},
      {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
      {'o', {0x00, 0x00, 0x0e, 0x11, 0x11, 0x11, 0x0e}},
      {'p', {0x00, 0x00, 0x1e, 0x11, 0x1e, 0x10, 0x10}},
      {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
      {'s', {0x00, 0x00, 0x0e, 0x10, 0x0e, 0x01, 0x1e}},
      {'t', {0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06}},
      {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0d}},
      {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0a, 0x04}},
      {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0a}},
      {'x', {0x00, 0x00, 0x11, 0x0a, 0x04, 0x0a, 0x11}},
      {'y', {0x00, 0x00, 0x11, 0x11, 0x0f, 0x01, 0x0e}},
      {'z', {0x00, 0x00, 0x1f, 0x02, 0x04, 0x08, 0x1f}},
  };
  return f;
}

struct Canvas {
  std::vector<std::uint8_t> px = std::vector<std::uint8_t>(kW * kH * 3, 255);
  void set(int x, int y, unsigned rgb) {
    if (x < 0 || y < 0 || x >= kW || y >= kH) return;
    std::uint8_t* p = &px[static_cast<std::size_t>((y * kW + x) * 3)];
    p[0] = static_cast<std::uint8_t>(rgb >> 16), p[1] = static_cast<std::uint8_t>(rgb >> 8);
    p[2] = static_cast<std::uint8_t>(rgb);
  }
  // Bresenham, `w` pixels wide.
  void line(int x0, int y0, int x1, int y1, unsigned rgb, int w = 1) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      for (int i = 0; i < w; ++i)
        for (int j = 0; j < w; ++j) set(x0 + i - w / 2, y0 + j - w / 2, rgb);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  int text(int x, int y, const std::string& s, unsigned rgb) {  // returns the end x
    for (char ch : s) {
      const auto it = font().find(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
      if (it != font().end())
        for (int r = 0; r < 7; ++r)
          for (int c = 0; c < 5; ++c)
            if (it->second[static_cast<std::size_t>(r)] & (0x10 >> c)) set(x + c, y + r, rgb);
      x += 6;
    }
    return x;
  }
};

// Round tick step: 1, 2 or 5 x 10^k giving about n ticks over [lo, hi].
double tick_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string label(double v, double step) {
  const int digits = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step)));
  return fmt::format("{:.{}f}", v, digits);
}

}  // namespace

void write_plot(const std::string& path, const std::vector<Series>& series,
                const std::string& x_label, const std::string& y_label) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y))
        x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!(x0 <= x1)) throw Error(fmt::format("plot {}: no finite points to plot", path));
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double xs = tick_step(x0, x1, 8), ys = tick_step(y0, y1, 6);
  x0 = std::floor(x0 / xs) * xs, x1 = std::ceil(x1 / xs) * xs;
  y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
  const int pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) {
    return kLeft + static_cast<int>(std::lround((x - x0) / (x1 - x0) * pw));
  };
  auto py = [&](double y) {
    return kTop + ph - static_cast<int>(std::lround((y - y0) / (y1 - y0) * ph));
  };
  Canvas c;
  for (double x = x0; x <= x1 + xs / 2; x += xs) {
    c.line(px(x), kTop, px(x), kTop + ph, 0xe0e0e0);
    const std::string l = label(x, xs);
    c.text(px(x) - 3 * static_cast<int>(l.size()), kTop + ph + 8, l, 0x000000);
  }
  for (double y = y0; y <= y1 + ys / 2; y += ys) {
    c.line(kLeft, py(y), kLeft + pw, py(y), 0xe0e0e0);
    const std::string l = label(y, ys);
    c.text(kLeft - 8 - 6 * static_cast<int>(l.size()), py(y) - 3, l, 0x000000);
  }
  c.line(kLeft, kTop, kLeft, kTop + ph, 0x000000);
  c.line(kLeft, kTop + ph, kLeft + pw, kTop + ph, 0x000000);
  c.text(kLeft + pw / 2 - 3 * static_cast<int>(x_label.size()), kH - 18, x_label, 0x000000);
  c.text(8, 10, y_label, 0x000000);
  int lx = kLeft + pw - 160, ly = kTop + 8;
  for (const Series& s : series) {
    bool have = false;
    int ox = 0, oy = 0;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      if (have) c.line(ox, oy, px(x), py(y), s.rgb, 2);
      ox = px(x), oy = py(y), have = true;
    }
    if (s.points.size() == 1 && have) c.line(ox - 2, oy, ox + 2, oy, s.rgb, 3);
    c.line(lx, ly + 3, lx + 20, ly + 3, s.rgb, 3);
    c.text(lx + 26, ly, s.name, 0x000000);
    ly += 14;
  }
  // PNG in memory, then an atomic write.
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw Error("plot: cannot start libpng");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error(fmt::format("plot {}: libpng failed", path));
  }
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, png_size_t n) {
        try {  // no C++ exception may unwind through libpng's C frames
          static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<char*>(data), n);
        } catch (...) {
          png_error(p, "out of memory");
        }
      },
      nullptr);
  png_set_IHDR(png, info, kW, kH, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < kH; ++y) png_write_row(png, &c.px[static_cast<std::size_t>(y * kW * 3)]);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  write_file_atomic(path, out);
}

}  // namespace tern::train
