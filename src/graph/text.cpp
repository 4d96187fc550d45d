#include "graph/text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops.h"
#include "util/error.h"
#include "util/file.h"

namespace tern::graph {

namespace {

std::string attr_text(const Attr& a) {
  if (const auto* i = std::get_if<std::int64_t>(&a)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&a)) {
    std::string s = fmt::format("{}", *d);  // shortest round-trip form
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  }
  if (const auto* s = std::get_if<std::string>(&a)) return *s;
  return fmt::format("[{}]", fmt::join(std::get<std::vector<std::int64_t>>(a), ", "));
}

std::string type_text(const Value& v) {
  return fmt::format("{} {}", shape_string(v.shape), isa::name(v.dtype));
}

// A line split into tokens: %names, words (identifiers, numbers), and the
// punctuation = , : [ ] { }.
struct Lexer {
  std::string_view s;
  std::size_t i = 0;
  const std::string& source;
  int line;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}:{}: {}", source, line, what));
  }
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool done() {
    skip();
    return i >= s.size();
  }
  char peek() {
    skip();
    return i < s.size() ? s[i] : '\0';
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++i;
    return true;
  }
  void expect(char c) {
    if (!accept(c))
      fail(fmt::format("expected '{}' at '{}'", c,
                       done() ? "end of line" : std::string(s.substr(i))));
  }
  static bool word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
           c == '+';
  }
  std::string word() {
    skip();
    const std::size_t b = i;
    while (i < s.size() && word_char(s[i])) ++i;
    if (b == i)
      fail(fmt::format("expected a name or number at '{}'",
                       i < s.size() ? std::string(s.substr(i)) : "end of line"));
    return std::string(s.substr(b, i - b));
  }
  std::string value_name() {
    expect('%');
    if (i >= s.size() || !word_char(s[i])) fail("expected a value name after '%'");
    return word();
  }
  std::int64_t integer() {
    const std::string w = word();
    std::int64_t v = 0;
    const auto r = std::from_chars(w.data(), w.data() + w.size(), v);
    if (r.ec != std::errc() || r.ptr != w.data() + w.size())
      fail(fmt::format("'{}' is not an integer", w));
    return v;
  }
  std::vector<std::int64_t> int_list() {
    expect('[');
    std::vector<std::int64_t> out;
    if (accept(']')) return out;
    do out.push_back(integer());
    while (accept(','));
    expect(']');
    return out;
  }
  // "[d0, d1] dtype"
  std::pair<Shape, DType> type() {
    Shape sh = int_list();
    const std::string d = word();
    try {
      return {sh, isa::parse_dtype(d)};
    } catch (const Error& e) {
      fail(e.what());
    }
  }
  Attr attr_value() {
    if (peek() == '[') return int_list();
    const std::string w = word();
    const bool numeric = std::isdigit(static_cast<unsigned char>(w[0])) ||
                         ((w[0] == '-' || w[0] == '+') && w.size() > 1) || w == "inf" ||
                         w == "nan";  // as print writes infinite and NaN reals
    if (!numeric) return w;
    if (w.find_first_of(".eEn") == std::string::npos) {
      std::int64_t v = 0;
      const auto r = std::from_chars(w.data(), w.data() + w.size(), v);
      if (r.ec == std::errc() && r.ptr == w.data() + w.size()) return v;
    }
    double d = 0;
    const auto r = std::from_chars(w.data(), w.data() + w.size(), d);
    if (r.ec != std::errc() || r.ptr != w.data() + w.size())
      fail(fmt::format("'{}' is not a number", w));
    return d;
  }
};

}  // namespace

std::string print(const Graph& g) {
  std::string out = fmt::format("graph {} {{\n", g.name());
  for (const Node& n : g.nodes()) {
    std::vector<std::string> outs, ins, types, attrs;
    for (int v : n.outputs) {
      outs.push_back("%" + g.value(v).name);
      types.push_back(type_text(g.value(v)));
    }
    for (int v : n.inputs) ins.push_back("%" + g.value(v).name);
    for (const auto& [k, a] : n.attrs) attrs.push_back(fmt::format("{} = {}", k, attr_text(a)));
    out += fmt::format("  {} = {}", fmt::join(outs, ", "), op_name(n.op));
    if (!ins.empty()) out += fmt::format(" {}", fmt::join(ins, ", "));
    if (!attrs.empty()) out += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
    out += fmt::format(" : {}\n", fmt::join(types, ", "));
  }
  if (!g.outputs().empty()) {
    std::vector<std::string> outs;
    for (int v : g.outputs()) outs.push_back("%" + g.value(v).name);
    out += fmt::format("  output {}\n", fmt::join(outs, ", "));
  }
  for (const auto& [o, i] : g.carries())
    out += fmt::format("  carry %{} -> %{}\n", g.value(o).name, g.value(i).name);
  out += "}\n";
  return out;
}

Graph parse(std::string_view text, const std::string& source) {
  std::optional<Graph> g;
  bool closed = false;
  int line = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t eol = std::min(text.find('\n', pos), text.size());
    std::string_view l = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line;
    if (const auto hash = l.find('#'); hash != std::string_view::npos) l = l.substr(0, hash);
    Lexer lx{l, 0, source, line};
    if (lx.done()) {
      if (eol == text.size()) break;
      continue;
    }
    if (closed) lx.fail("text after the graph's closing '}'");
    if (!g) {
      if (!Lexer::word_char(lx.peek()) || lx.word() != "graph") lx.fail("expected 'graph NAME {'");
      g.emplace(lx.word());
      lx.expect('{');
      if (!lx.done()) lx.fail("expected the end of the line after '{'");
      continue;
    }
    if (lx.accept('}')) {
      closed = true;
      continue;
    }
    try {
      if (lx.peek() != '%') {
        const std::string kw = lx.word();
        if (kw == "carry") {  // carry %out -> %in
          const std::string from = lx.value_name();
          lx.expect('-'), lx.expect('>');
          const std::string to = lx.value_name();
          const int a = g->find(from), b = g->find(to);
          if (a < 0) lx.fail(fmt::format("carry %{} is not defined", from));
          if (b < 0) lx.fail(fmt::format("carry into %{}: not defined", to));
          g->carry(a, b);
          if (!lx.done()) lx.fail("expected the end of the line");
          continue;
        }
        if (kw != "output") lx.fail("expected '%name = op ...', 'output %name', 'carry' or '}'");
        do {
          const std::string n = lx.value_name();
          const int v = g->find(n);
          if (v < 0) lx.fail(fmt::format("output %{} is not defined", n));
          g->mark_output(v);
        } while (lx.accept(','));
        if (!lx.done()) lx.fail("expected ',' or the end of the line");
        continue;
      }
      std::vector<std::string> names;
      do names.push_back(lx.value_name());
      while (lx.accept(','));
      lx.expect('=');
      const std::string opname = lx.word();
      const Op op = parse_op(opname);
      std::vector<int> ins;
      if (lx.peek() == '%') {
        do {
          const std::string n = lx.value_name();
          const int v = g->find(n);
          if (v < 0) lx.fail(fmt::format("%{} is used before it is defined", n));
          ins.push_back(v);
        } while (lx.accept(','));
      }
      Attrs attrs;
      if (lx.accept('{')) {
        if (!lx.accept('}')) {
          do {
            const std::string k = lx.word();
            lx.expect('=');
            if (attrs.contains(k)) lx.fail(fmt::format("attribute '{}' given twice", k));
            attrs[k] = lx.attr_value();
          } while (lx.accept(','));
          lx.expect('}');
        }
      }
      lx.expect(':');
      std::vector<std::pair<Shape, DType>> types;
      do types.push_back(lx.type());
      while (lx.accept(','));
      if (!lx.done()) lx.fail("expected ',' or the end of the line");
      if (types.size() != names.size())
        lx.fail(fmt::format("{} results named, {} types given", names.size(), types.size()));
      std::vector<int> outs;
      if (op == Op::input || op == Op::param) {
        if (!ins.empty() || !attrs.empty() || names.size() != 1)
          lx.fail(fmt::format("{} takes no operands or attributes and names one value", opname));
        outs.push_back(op == Op::input ? g->input(names[0], types[0].first, types[0].second)
                                       : g->param(names[0], types[0].first, types[0].second));
      } else {
        outs = g->add(op, ins, attrs, names);
      }
      for (std::size_t i = 0; i < outs.size(); ++i) {
        const Value& v = g->value(outs[i]);
        if (v.shape != types[i].first || v.dtype != types[i].second)
          lx.fail(fmt::format("%{}: the text says {} {}, {} gives {}", v.name,
                              shape_string(types[i].first), isa::name(types[i].second), opname,
                              type_text(v)));
      }
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.starts_with(source + ":")) throw;
      lx.fail(what);
    }
    if (eol == text.size()) break;
  }
  if (!g) throw Error(fmt::format("{}: no 'graph NAME {{' found", source));
  if (!closed) throw Error(fmt::format("{}:{}: the graph is not closed with '}}'", source, line));
  return std::move(*g);
}

Graph load(const std::string& path) {
  return parse(read_file(path), path);
}

void save(const Graph& g, const std::string& path) {
  write_file_atomic(path, print(g));
}

}  // namespace tern::graph
