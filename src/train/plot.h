// The loss-curve plot `tern train --plot` writes at the end of a run: a
// PNG (libpng) of one or more series against the step, with axes, grid,
// tick labels and a legend. The drawing is tern's own (lines and a 5 x 7
// pixel font, about 150 lines): Debian has no small C++ plotting library,
// and a curve for a person to glance at needs no more.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tern::train {

struct Series {
  std::string name;  // legend (lower-case letters, digits, spaces, ". - _ :")
  unsigned rgb = 0x1f77b4;
  std::vector<std::pair<double, double>> points;  // (step, value); non-finite values skipped
};

// Writes an 800 x 500 PNG atomically. Throws tern::Error when nothing is
// plottable or the file cannot be written.
void write_plot(const std::string& path, const std::vector<Series>& series,
                const std::string& x_label, const std::string& y_label);

}  // namespace tern::train
