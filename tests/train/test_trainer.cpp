// The training loop: the learning-rate schedule, and short runs of a small
// GPT on TinyShakespeare on the simulated trn3: the loss falls, and two runs
// of one config give the same losses bit for bit.
#include <gtest/gtest.h>

#include "graph/lower.h"
#include "train/trainer.h"
#include "util/error.h"

namespace tern::train {
namespace {

TEST(Trainer, WarmupThenCosine) {
  TrainConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup = 10, c.steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1e-3);
  EXPECT_NEAR(learning_rate(c, 60), 0.5 * (1e-3 + 1e-4), 1e-15);  // half way down the cosine
  EXPECT_DOUBLE_EQ(learning_rate(c, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500), 1e-4);
}

TrainConfig tiny(const std::string& recipe) {
  TrainConfig c;
  c.text = TERN_DATA_DIR "/tinyshakespeare.txt";
  c.layers = 1, c.dim = 128, c.heads = 2, c.batch = 4, c.seq = 64;
  c.recipe = recipe, c.cores = 2;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup = 2, c.steps = 12;
  return c;
}

TEST(Trainer, LossFallsAndRunsRepeat) {
  for (const char* recipe : {"bf16", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    Trainer a(tiny(recipe)), b(tiny(recipe));
    EXPECT_EQ(a.tokenizer().vocab(), 65);
    EXPECT_TRUE(a.executable().unlowered.empty());
    std::vector<double> la, lb;
    for (int i = 0; i < 12; ++i) la.push_back(a.step().loss), lb.push_back(b.step().loss);
    EXPECT_EQ(la, lb);                   // deterministic, bit for bit
    EXPECT_NEAR(la.front(), 4.17, 0.1);  // ln 65 at initialization
    EXPECT_LT(la.back(), la.front() - 0.5) << la.back();
    // Validation: the same batches each time, the same number for the twin
    // run, and below the untrained loss (what was learned carries over to
    // held-out text).
    const double v = a.validate(2);
    EXPECT_EQ(v, a.validate(2));
    EXPECT_EQ(v, b.validate(2));
    EXPECT_LT(v, la.front() - 0.3);
  }
}

TEST(Trainer, BadConfigs) {
  TrainConfig c = tiny("bf16");
  c.text = "/nonexistent.txt";
  EXPECT_THROW(Trainer{c}, Error);
  c = tiny("bf16");
  c.recipe = "fp4";
  EXPECT_THROW(Trainer{c}, Error);
  c = tiny("bf16");
  c.min_lr = 1.0;
  EXPECT_THROW(Trainer{c}, Error);
}

}  // namespace
}  // namespace tern::train
