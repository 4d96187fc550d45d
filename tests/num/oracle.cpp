#include "oracle.h"

#include <mpfr.h>

namespace tern::num::oracle {

namespace {
mpfr_rnd_t mode(Dir d) {
  switch (d) {
    case Dir::down:
      return MPFR_RNDD;
    case Dir::up:
      return MPFR_RNDU;
    default:
      return MPFR_RNDN;
  }
}

// Holds MPFR's global exponent range for the scope of one rounding.
struct Range {
  mpfr_exp_t old_min = mpfr_get_emin(), old_max = mpfr_get_emax();
  Range(mpfr_exp_t lo, mpfr_exp_t hi) {
    mpfr_set_emin(lo);
    mpfr_set_emax(hi);
  }
  ~Range() {
    mpfr_set_emin(old_min);
    mpfr_set_emax(old_max);
  }
};
}  // namespace

double round_float(float x, int man_bits, int emin, Dir dir) {
  // MPFR values are 0.1bbb... x 2^e. The smallest subnormal 2^(emin - m) is
  // 0.1 * 2^(emin - m + 1): that is MPFR's emin for IEEE-style subnormals.
  const Range range(emin - man_bits + 1, 1 << 20);
  mpfr_t v;
  mpfr_init2(v, man_bits + 1);
  const int t = mpfr_set_flt(v, x, mode(dir));
  mpfr_subnormalize(v, t, mode(dir));
  const double r = mpfr_get_d(v, MPFR_RNDN);  // exact: <= 24 bits, in double range
  mpfr_clear(v);
  return r;
}

double round_fixed(float x, int frac_bits) {
  mpfr_t v;
  mpfr_init2(v, 64);
  mpfr_set_flt(v, x, MPFR_RNDN);  // exact
  mpfr_mul_2si(v, v, frac_bits, MPFR_RNDN);
  mpfr_rint(v, v, MPFR_RNDN);  // to an integer, ties to even
  mpfr_div_2si(v, v, frac_bits, MPFR_RNDN);
  const double r = mpfr_get_d(v, MPFR_RNDN);
  mpfr_clear(v);
  return r;
}

double round_pow2(float x) {
  mpfr_t v;
  mpfr_init2(v, 1);
  mpfr_set_flt(v, x, MPFR_RNDN);
  const double r = mpfr_get_d(v, MPFR_RNDN);
  mpfr_clear(v);
  return r;
}

}  // namespace tern::num::oracle
