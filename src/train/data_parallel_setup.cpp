// The run's fingerprint, its data-parallel settings and the state the ranks share (data_parallel_setup.h).
#include "train/data_parallel_setup.h"

#include <algorithm>
#include <charconv>

#include <zlib.h>

#include "core/errors.h"
#include "dist/nccl_comm.h"
#include "model/fused_patterns.h"

namespace {

// The shortest text that reads back as the same double: "0.1", not "0.10000000000000001".
std::string number(double v) {
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// A checksum of bytes of any length (zlib's crc32 takes at most 4 GiB a call).
uint32_t checksum(const void* data, size_t bytes, uint32_t crc = 0) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, n));
    p += n;
    bytes -= n;
  }
  return crc;
}

std::string data_identity(const DataSplit& d, const Normalization& n) {
  uint32_t crc = checksum(d.train.labels.data(), d.train.labels.size());
  crc = checksum(d.test.labels.data(), d.test.labels.size(), crc);
  crc = checksum(n.mean, sizeof(n.mean), crc);
  crc = checksum(n.stdev, sizeof(n.stdev), crc);
  return d.train.name + ", " + std::to_string(d.train.count) + " train and " + std::to_string(d.test.count) +
         " test images, checksum " + std::to_string(crc);
}

std::string checkpoint_identity(const Checkpoint* c) {
  if (!c) return "none";
  uint32_t crc = checksum(c->master.data(), c->master.size() * sizeof(float));
  crc = checksum(c->momentum.data(), c->momentum.size() * sizeof(float), crc);
  crc = checksum(c->running.data(), c->running.size() * sizeof(float), crc);
  return "step " + std::to_string(c->meta.step) + ", checksum " + std::to_string(crc);
}

}  // namespace

Fingerprint run_fingerprint(const BuildSettings& b, const Options& o, int world, const DataSplit& data,
                            const Normalization& norm, const Checkpoint* resume) {
  Fingerprint f;
  f.add("build", b.describe()).add("NCCL", nccl_version_text()).add("ranks", std::to_string(world));
  f.add("data", data_identity(data, norm)).add("--synthetic-size", std::to_string(o.synthetic_size));
  f.add("--image-size", std::to_string(o.image_size));
  f.add("--epochs", std::to_string(o.epochs)).add("--steps", std::to_string(o.steps));
  f.add("--batch", std::to_string(o.batch)).add("--lr", number(o.lr)).add("--min-lr", number(o.min_lr));
  f.add("--warmup-epochs", number(o.warmup_epochs)).add("--momentum", number(o.momentum));
  f.add("--no-lr-scaling", o.lr_scaling ? "off" : "on").add("--warmup-cap", number(o.warmup_cap));
  f.add("--wd", number(o.weight_decay)).add("--no-nesterov", o.nesterov ? "off" : "on");
  f.add("--seed", std::to_string(o.seed)).add("--no-eval", o.eval ? "off" : "on");
  f.add("--label-smoothing", number(o.label_smoothing)).add("--ema", number(o.ema));
  f.add("--crop-pad", std::to_string(o.crop_pad)).add("--tta-flip", o.tta_flip ? "on" : "off").add("--zero-init-residual", o.zero_init_residual ? "on" : "off");
  f.add("--workspace-mb", std::to_string(o.workspace_mb)).add("--no-tf32", o.tf32 ? "off" : "on");
  f.add("--deterministic", o.deterministic ? "on" : "off").add("--no-cuda-graph", o.cuda_graph ? "off" : "on");
  f.add("--no-fuse", o.no_fuse_given ? fused_pattern_list_text(o.no_fuse_patterns) : "default");
  f.add("--loss-scale", number(o.loss_scale));
  f.add("--loss-scale-window", std::to_string(o.loss_scale_window));
  f.add("--warmup-steps", std::to_string(o.warmup_steps)).add("--profile-steps", std::to_string(o.profile_steps));
  f.add("--progress-every", std::to_string(o.progress_every)).add("--save-every", std::to_string(o.save_every));
  f.add("--bucket-mb", number(o.bucket_mb)).add("--allreduce-dtype", o.allreduce_dtype.empty() ? "default" : o.allreduce_dtype);
  f.add("--grad-compression", o.grad_compression).add("--accumulate", std::to_string(o.accumulate));
  f.add("--last-bucket-mb", number(o.last_bucket_mb));
  f.add("--dist-timeout", number(o.dist_timeout)).add("checkpoint", checkpoint_identity(resume));
  return f;
}

DataParallelConfig data_parallel_config(const BuildSettings& b, const Options& o) {
  DataParallelConfig c;
  c.bucket_mb = o.bucket_mb;
  c.last_bucket_mb = o.last_bucket_mb;
  c.reduce_type = o.allreduce_dtype;
  c.compression = o.grad_compression;
  c.overlap = b.ddp_overlap;
  c.timeout_s = o.dist_timeout;
  return c;
}

void check_global_batch(const CheckpointMeta& saved, int batch, int world, int accumulate, const std::string& file) {
  const int per_step = batch * world * accumulate;
  if (saved.batch == per_step) return;
  const int parts = world * accumulate;
  const std::string micro = accumulate > 1 ? " with --accumulate " + std::to_string(accumulate) : "";
  std::string hint = saved.batch % parts == 0 ? "resume with --batch " + std::to_string(saved.batch / parts) + " on " +
                                                   std::to_string(world) + " GPUs" + micro
                                              : "resume on a number of GPUs (times --accumulate) that divides it";
  throw InputError(file + ": trained with a global batch of " + std::to_string(saved.batch) +
                   " images per step (--batch per GPU times GPUs" + (accumulate > 1 ? " times --accumulate" : "") +
                   "), this run has " + std::to_string(batch) + " x " + std::to_string(world) +
                   (accumulate > 1 ? " x " + std::to_string(accumulate) : "") + " = " + std::to_string(per_step) + ": " +
                   hint);
}

void share_start_state(DataParallel& dp, TrainingNetwork& net, cudaStream_t stream) {
  ParamStore& p = net.params();
  dp.broadcast_from_root(p.master_all(), p.total() * sizeof(float));
  dp.broadcast_from_root(p.momentum_all(), p.total() * sizeof(float));
  dp.broadcast_from_root(net.running_stats(), net.running_stats_count() * sizeof(float));
  p.refresh_working_copy(stream);
}

void average_running_stats(DataParallel& dp, TrainingNetwork& net) { dp.average(net.running_stats(), net.running_stats_count()); }
