// The host processes a simulation spreads over: one process, or
// the ranks of `mpirun -np R` (OpenMPI). Each rank simulates a subset of the
// chips; the real bytes of a collective's inputs travel between ranks over
// MPI so that every rank can compute the collective's result in the
// documented order (runtime::System), and the simulated clocks stay the
// same on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace tern::runtime {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine` (any length, may differ by rank), in rank order.
  // Collective: every rank must call it, in the same order.
  virtual std::vector<std::vector<std::uint8_t>> all_gather(std::span<const std::uint8_t> mine) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Ends every rank of the job with `code` (after an error on one rank:
  // the others would wait for it forever in a collective).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The process's communicator: MPI's world when the process was started by
// mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE set; MPI initialized on first
// use, finalized at exit), else a single rank. Throws tern::Error when
// mpirun started it and this build has no MPI.
Comm& world();
// A single rank (tests, library users that run in one process).
std::unique_ptr<Comm> single_process();

// Blocks of `n` items over `ranks` ranks: rank k holds [first(k), first(k+1)),
// sizes differing by at most one (the first n % ranks ranks hold one more).
inline std::int64_t block_first(std::int64_t n, int ranks, int k) {
  const std::int64_t q = n / ranks, r = n % ranks;
  return k * q + (k < r ? k : r);
}

}  // namespace tern::runtime
