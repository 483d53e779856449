// Checkpoints of a run: their metadata, the state they carry, and the pending-save rule.
#include "train/checkpointing.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "core/check.h"

CheckpointMeta run_meta(const BuildSettings& build, const ParamListing& params, const Dataset& train, const Options& o) {
  std::vector<std::pair<std::string, std::vector<int>>> sig;
  for (const ParamSpec& t : params.tensors) sig.emplace_back(t.name, t.shape);
  CheckpointMeta m;
  m.precision = dtype_name(build.precision);
  m.layout = layout_name(build.layout);
  m.model_signature = model_signature(sig);
  m.params = params.total;
  m.running = params.running;
  m.image_side = train.side;
  m.class_names = train.class_names;
  m.data = train.name;
  m.batch = o.batch;
  m.epochs = o.epochs;
  m.seed = o.seed;
  return m;
}

Checkpoint capture_checkpoint(const Network& net, const CheckpointMeta& meta, const WeightAverage* average) {
  const ParamStore& p = net.params();
  Checkpoint c;
  c.meta = meta;
  c.master.resize(p.total());
  c.momentum.resize(p.total());
  c.running.resize(net.running_stats_count());
  CUDA_CHECK(cudaMemcpy(c.master.data(), p.master_all(), c.master.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(c.momentum.data(), p.momentum_all(), c.momentum.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(c.running.data(), net.running_stats(), c.running.size() * 4, cudaMemcpyDeviceToHost));
  if (average) {
    c.ema = average->download();
    c.meta.ema_decay = average->decay();
  }
  return c;
}

void restore_checkpoint(Network& net, const Checkpoint& c, cudaStream_t stream) {
  ParamStore& p = net.params();
  CUDA_CHECK(cudaMemcpy(p.master_all(), c.master.data(), c.master.size() * 4, cudaMemcpyHostToDevice));
  if (p.momentum_all())  // a network built for inference keeps no momentum
    CUDA_CHECK(cudaMemcpy(p.momentum_all(), c.momentum.data(), c.momentum.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(net.running_stats(), c.running.data(), c.running.size() * 4, cudaMemcpyHostToDevice));
  p.refresh_working_copy(stream);
}

std::vector<std::string> default_rescue_dirs() {
  std::vector<std::string> dirs;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd))) dirs.push_back(cwd);
  const char* tmp = std::getenv("TMPDIR");
  dirs.push_back(tmp && *tmp ? tmp : "/tmp");
  return dirs;
}

SaveKeeper::SaveKeeper(const Options& o, std::vector<std::string> rescue_dirs)
    : rescue_dirs_(std::move(rescue_dirs)), path_(o.save), resume_(o.resume), every_(o.save_every),
      existed_(!o.save.empty() && access(o.save.c_str(), F_OK) == 0) {}

namespace {
// Saves `c` to `path`; returns why it failed, or "" when it is saved.
std::string try_save(const std::string& path, const Checkpoint& c) {
  try {
    save_checkpoint(path, c);
    return "";
  } catch (const Fatal& e) {
    return e.what();
  }
}
}  // namespace

// A finished run must never be lost to a full disk: the state goes wherever it can, and the run stops
// saying where.
void SaveKeeper::write(const Checkpoint& c, const std::string& to) const {
  const std::string failure = try_save(to, c);
  if (failure.empty()) return;
  const std::string lost = "cannot save the checkpoint of step " + std::to_string(c.meta.step) + " to " + to +
                           " (" + failure + ")";
  std::string rescue_failures;
  for (const std::string& dir : rescue_dirs_) {
    const std::string rescue = dir + "/rescue-" + std::to_string(getpid()) + ".ckpt";
    const std::string why = try_save(rescue, c);
    if (why.empty()) throw Fatal(lost + "; saved it to " + rescue + " instead: continue with --resume " + rescue);
    rescue_failures += "; " + why;
  }
  throw Fatal(lost + ", nor to a rescue file" + rescue_failures + ": this state is lost");
}

void SaveKeeper::save(const Checkpoint& c, const std::string& to, bool periodic) {
  if (pending_.step >= 0) {
    if (!periodic) std::remove(pending_path().c_str());  // a periodic save overwrites it below
    pending_ = {};
  }
  if (!periodic) {
    write(c, to);
    return;
  }
  write(c, pending_path());  // atomic: FILE.pending is whole or absent (a leftover is overwritten)
  pending_ = {static_cast<long>(c.meta.step), c.meta.skipped_steps};
}

void SaveKeeper::on_read(long steps, long skipped, bool diverged) {
  if (pending_save_proven(pending_, steps, skipped, diverged)) commit_pending();
}

void SaveKeeper::commit_pending() {
  // rename() is atomic: FILE is the old proven state or the new one, whatever happens meanwhile.
  if (std::rename(pending_path().c_str(), path_.c_str()) != 0)
    throw Fatal(pending_path() + ": cannot rename to " + path_ + ": " + std::strerror(errno) +
                " (the saved state stays in " + pending_path() + ": rename it to resume from it)");
  kept_step_ = pending_.step;
  pending_ = {};
}

std::string SaveKeeper::after_divergence(long first_step) {
  if (path_.empty()) return "";
  if (every_ > 0) std::remove(pending_path().c_str());
  pending_ = {};
  if (kept_step_ >= 0) return "; " + path_ + " keeps its last good state (step " + std::to_string(kept_step_) + ")";
  if (!existed_)
    return std::string("; no checkpoint was kept") +
           (every_ > 0 ? " (no periodic save was shown good before the divergence)" : "");
  if (resume_ == path_)
    return "; " + path_ + " keeps the state this run resumed from (step " + std::to_string(first_step) + ")";
  return "; " + path_ + " keeps what it held before this run";
}
