// runtime::world() over OpenMPI (Debian's libopenmpi-dev).
#include <cstdlib>
#include <memory>

#include <fmt/format.h>
#include <mpi.h>

#include "runtime/comm.h"
#include "util/error.h"

namespace tern::runtime {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(
      fmt::format("MPI {} failed: {}", what, std::string(msg, static_cast<std::size_t>(len))));
}

class Mpi final : public Comm {
 public:
  Mpi() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      // The simulation may run chips on host threads, but only the main
      // thread calls MPI.
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
      owns_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~Mpi() override {
    int done = 0;
    MPI_Finalized(&done);
    if (owns_ && !done) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::vector<std::uint8_t>> all_gather(std::span<const std::uint8_t> mine) override {
    // Sizes first, then the bytes (MPI counts are int: chunks beyond 2 GiB
    // are not needed by anything tern sends and are refused).
    if (mine.size() > static_cast<std::size_t>(INT32_MAX))
      throw Error(
          fmt::format("not supported: an MPI exchange of {} bytes (over 2 GiB)", mine.size()));
    const int n = static_cast<int>(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(counts.size());
    check(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD), "allgather");
    long long total = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      displs[k] = static_cast<int>(total);
      total += counts[k];
    }
    if (total > INT32_MAX)
      throw Error(fmt::format("not supported: an MPI exchange of {} bytes (over 2 GiB)", total));
    std::vector<std::uint8_t> all(static_cast<std::size_t>(total));
    check(MPI_Allgatherv(mine.data(), n, MPI_BYTE, all.data(), counts.data(), displs.data(),
                         MPI_BYTE, MPI_COMM_WORLD),
          "allgatherv");
    std::vector<std::vector<std::uint8_t>> out(counts.size());
    for (std::size_t k = 0; k < counts.size(); ++k)
      out[k].assign(all.begin() + displs[k], all.begin() + displs[k] + counts[k]);
    return out;
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  int rank_ = 0, size_ = 1;
  bool owns_ = false;
};

}  // namespace

Comm& world() {
  static std::unique_ptr<Comm> w = []() -> std::unique_ptr<Comm> {
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE"))
      return std::make_unique<Mpi>();
    return single_process();
  }();
  return *w;
}

}  // namespace tern::runtime
