// The NCCL communicator of a data-parallel run, created non-blocking so that no NCCL call can hang
// a rank for ever: set-up is polled with a deadline, every call that reports "in progress" is
// completed by polling ncclCommGetAsyncError, and ncclCommAbort (from any thread) stops a rank whose
// peer died or hung (peer_watch.h decides when). NVLink multicast (NVLS) stays off unless the user
// set NCCL_NVLS_ENABLE: the GPU machines this project runs on require it off.
#pragma once

#include <atomic>
#include <string>

#include <nccl.h>

// Every NCCL status is checked: a failure throws Fatal with the call, NCCL's own message and file:line.
void nccl_check(ncclResult_t r, const char* call, const char* file, int line);
#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)

// Sets what NCCL reads from the environment at set-up (NCCL_NVLS_ENABLE=0 unless already set);
// every function here that calls NCCL first calls it.
void prepare_nccl_environment();
// "2.28.9": the NCCL library this process runs with.
std::string nccl_version_text();
// A fresh unique id (rank 0 makes it and the rendezvous hands it out), as bytes.
std::string nccl_unique_id();

class NcclComm {
 public:
  // Begins joining rank `rank` of `world` to the communicator of `id`, on the current CUDA device.
  // NCCL goes on with the set-up on a thread of its own, beside the caller's work (building the
  // network): wait_ready() before the first call on it. (With the CUDA context made earlier too, the
  // start-up line's `ranks` phase fell from 0.98-1.16 s to 0.03-0.09 s on two H100s, 2026-11-27.)
  NcclComm(const std::string& id, int rank, int world);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Until the set-up has finished; throws InputError when it does not within timeout_s (a rank never
  // joined), Fatal when it failed. Once done, returns at once.
  void wait_ready(double timeout_s);
  bool ready() const { return ready_; }
  ncclComm_t get() const { return comm_; }
  // Completes a call on this communicator (or ncclGroupEnd of calls on it): waits while NCCL
  // reports it in progress, throws Fatal when it failed.
  void check(ncclResult_t r, const char* call, const char* file, int line) const;
  // Stops every NCCL operation of this communicator; callable from any thread, once.
  void abort();
  // What NCCL found wrong in the background (a peer's connection lost, ...), or "" (any thread).
  std::string async_error() const;

 private:
  ncclComm_t comm_ = nullptr;
  bool ready_ = false;
  std::atomic<bool> aborted_{false};
};
#define NCCL_COMM_CHECK(comm, call) (comm).check((call), #call, __FILE__, __LINE__)
