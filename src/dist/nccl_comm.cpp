// The non-blocking NCCL communicator (nccl_comm.h).
#include "dist/nccl_comm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/errors.h"
#include "dist/socket.h"

namespace {

constexpr double kTeardownSeconds = 30;  // finalize flushes what is queued; a peer that is gone cannot help

std::string failure(ncclResult_t r, const char* call, const char* file, int line, ncclComm_t comm) {
  std::string msg = std::string("NCCL ") + call + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += " (" + std::string(last) + ")";
  return msg + " at " + file + ":" + std::to_string(line);
}

// Polls the communicator's state until it is no longer in progress or the deadline passes.
ncclResult_t settle(ncclComm_t comm, Deadline deadline) {
  ncclResult_t state = ncclInProgress;
  while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress) {
    if (SteadyClock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return state;
}

}  // namespace

void nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
  if (r != ncclSuccess) throw Fatal(failure(r, call, file, line, nullptr));
}

void prepare_nccl_environment() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

std::string nccl_version_text() {
  prepare_nccl_environment();  // NCCL reads its environment once, at its first call: be first
  int v = 0;
  NCCL_CHECK(ncclGetVersion(&v));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
  return buf;
}

std::string nccl_unique_id() {
  prepare_nccl_environment();
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

NcclComm::NcclComm(const std::string& id, int rank, int world) {
  if (id.size() != sizeof(ncclUniqueId)) throw Fatal("NCCL unique id of " + std::to_string(id.size()) + " bytes");
  prepare_nccl_environment();
  ncclUniqueId uid;
  std::copy(id.begin(), id.end(), uid.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) throw Fatal(failure(r, "ncclCommInitRankConfig", __FILE__, __LINE__, comm_));
}

void NcclComm::wait_ready(double timeout_s) {
  if (ready_) return;
  const ncclResult_t state = settle(comm_, deadline_in(timeout_s));
  if (state == ncclInProgress) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw InputError("NCCL set-up did not finish within " + std::to_string(static_cast<int>(timeout_s)) +
                     " s: a rank did not join (see the other ranks' errors)");
  }
  if (state != ncclSuccess) {
    const std::string msg = failure(state, "ncclCommInitRankConfig", __FILE__, __LINE__, comm_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw Fatal(msg);
  }
  ready_ = true;
}

NcclComm::~NcclComm() {
  if (!comm_ || aborted_) return;
  if (!ready_) {  // the run failed before its first call: nothing is queued, and a set-up may never end
    ncclCommAbort(comm_);
    return;
  }
  // Finalize flushes this rank's queued operations; if that cannot finish, abort instead of hanging.
  const ncclResult_t r = ncclCommFinalize(comm_);
  if ((r == ncclSuccess || r == ncclInProgress) && settle(comm_, deadline_in(kTeardownSeconds)) == ncclSuccess)
    ncclCommDestroy(comm_);
  else
    ncclCommAbort(comm_);
}

void NcclComm::check(ncclResult_t r, const char* call, const char* file, int line) const {
  if (r == ncclInProgress) r = settle(comm_, Deadline::max());
  if (r != ncclSuccess) throw Fatal(failure(r, call, file, line, comm_));
}

void NcclComm::abort() {
  if (comm_ && !aborted_.exchange(true)) ncclCommAbort(comm_);
}

std::string NcclComm::async_error() const {
  if (!comm_ || aborted_) return "";
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) return "";
  const char* last = ncclGetLastError(comm_);
  return std::string("NCCL reported an error: ") + ncclGetErrorString(state) + (last && *last ? std::string(" (") + last + ")" : "");
}
