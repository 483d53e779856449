// The training program. One step is:
//   get batch -> copy batch -> forward (+ loss) -> backward -> optimizer step -> loss stats
// each inside its NVTX range, all inside "step N". What each optimization of the ladder changes is
// asked of `kBuild` (settings.h) here and in nowhere else but the loader and network configs.
#include "train.h"

#include <cuda_profiler_api.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>

#include "augment.h"
#include "autotune_cache.h"
#include "check.h"
#include "checkpoint.h"
#include "data.h"
#include "handles.h"
#include "json_line.h"
#include "kernels.h"
#include "loader.h"
#include "pending_save.h"
#include "profiling.h"
#include "resnet50.h"
#include "sample_grid.h"
#include "schedule.h"
#include "settings.h"
#include "step_timing.h"
#include "trace.h"

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

// Everything the GPU counts for us, in one allocation so one copy reads it all.
struct DeviceCounters {
  LossTotals train;  // since the start of the epoch
  LossTotals eval;
  ScalerState scaler;
};

struct Diverged : Fatal {
  using Fatal::Fatal;
};

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::localtime(&t));
  return buf;
}

std::string with_commas(long long v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(i, ",");
  return s;
}

std::string clock_text(double seconds) {
  const long s = std::lround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

double mean_loss(const LossTotals& t) { return t.count ? t.loss_sum / double(t.count) : NAN; }
double accuracy(const LossTotals& t) { return t.count ? double(t.correct) / double(t.count) : NAN; }

JsonLine settings_json(const Options& o, int workers) {
  JsonLine s;
  s.add("precision", dtype_name(kBuild.precision))
      .add("layout", layout_name(kBuild.layout))
      .add("loader", loader_name(kBuild.loader))
      .add("algo", algo_policy_name(kBuild.algo))
      .add("conv_api", conv_api_name(kBuild.conv_api))
      .add("device_loss", kBuild.device_loss)
      .add("workers", workers)
      .add("deterministic", o.deterministic)
      .add("tf32", o.tf32);
  return s;
}

class Trainer {
 public:
  explicit Trainer(const Options& o) : opt_(o) {}
  int run();

 private:
  void load_data();
  void setup_gpu();
  void start_from_checkpoint_or_init();
  bool train_epoch(int epoch);
  void train_step(int k);
  void optimizer_step(double lr);
  void loss_stats();
  void take_counters(const DeviceCounters& c, long steps);
  void check_divergence(const DeviceCounters& c, long steps) const;
  std::string what_save_keeps();
  void evaluate();
  void open_window();
  void close_window();
  void save(const std::string& path, bool periodic);
  void commit_pending();
  std::string pending_path() const { return opt_.save + ".pending"; }
  void write_loss_log(long first_step, long count);
  void read_counters_now();
  void progress_line(bool final);
  void epoch_report(int epoch, double seconds, double train_ms, double stall_ms);
  void summary();
  DeviceCounters* counters() const { return counters_dev_.as<DeviceCounters>(); }
  bool out_of_steps() const { return opt_.steps > 0 && step_ >= opt_.steps; }

  Options opt_;
  int workers_ = 1;
  // data
  DataSplit data_;
  std::string data_dir_;
  Normalization norm_{};
  // GPU
  std::unique_ptr<GpuContext> ctx_;
  cudaDeviceProp prop_{};
  size_t free_before_ = 0;
  double peak_mem_mb_ = 0;
  std::unique_ptr<AutotuneCache> cache_;
  std::unique_ptr<ResNet50> net_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<StepTiming> timing_;
  std::unique_ptr<CuptiTrace> trace_;
  DeviceBuffer counters_dev_, loss_history_;
  PinnedBuffer counters_host_;
  std::unique_ptr<Event> counters_read_;
  bool read_in_flight_ = false;
  DeviceCounters last_{};  // the latest counters the host has seen
  long read_covers_ = 0;   // step_ when the in-flight read was enqueued: the steps it covers
  long clean_steps_ = 0;   // the most steps a read has covered without finding a divergence
  // --save-every (pending_save.h): the periodic save not yet shown good, and what --save FILE holds
  PendingSave pending_;
  long kept_step_ = -1;        // the step of the state this run made FILE; -1: none yet
  bool save_existed_ = false;  // FILE was there before this run
  // position
  LrSchedule schedule_;
  long step_ = 0;          // steps done in all
  long first_step_ = 0;    // step_ when this process started
  int start_epoch_ = 0, start_k_ = 0;
  int steps_per_epoch_ = 0;
  std::unique_ptr<Checkpoint> resume_;
  // the steady-state window
  long window_first_ = 0, window_last_ = 0;
  std::unique_ptr<Event> window_start_, window_end_;
  bool window_open_ = false, window_done_ = false;
  double window_ms_ = 0, window_stall_ms_ = 0, gpu_busy_pct_ = NAN;
  // reports
  std::chrono::steady_clock::time_point progress_t0_;
  long progress_step0_ = 0;
  double final_test_loss_ = NAN, final_test_acc_ = NAN, final_train_loss_ = NAN, final_train_acc_ = NAN;
  long evaluated_at_ = -1;  // step_ at the last evaluation
  int epoch_now_ = 0, k_now_ = 0;
  bool tty_ = false;
};

// ---- set-up -------------------------------------------------------------------------------------
void Trainer::load_data() {
  std::string which = opt_.data;
  if (which == "auto") {
    if (!opt_.data_dir.empty())
      which = access((opt_.data_dir + "/data_batch_1.bin").c_str(), F_OK) == 0 ? "cifar10" : "fashion-mnist";
    else if (!find_cifar10_dir().empty()) which = "cifar10";
    else if (!find_fashion_mnist_dir().empty()) which = "fashion-mnist";
    else
      throw InputError("no data set found: run `make data` (fetches CIFAR-10, needs internet), install the "
                       "Debian package dataset-fashion-mnist, or use --data synthetic");
  }
  if (which == "cifar10") {
    data_dir_ = opt_.data_dir.empty() ? find_cifar10_dir() : opt_.data_dir;
    if (data_dir_.empty()) data_dir_ = "data/cifar-10-batches-bin";
    data_ = load_cifar10(data_dir_);
  } else if (which == "fashion-mnist") {
    data_dir_ = opt_.data_dir.empty() ? find_fashion_mnist_dir() : opt_.data_dir;
    data_ = load_fashion_mnist(data_dir_);
  } else {
    data_dir_ = "(generated)";
    data_ = make_synthetic(opt_.synthetic_size, std::max(opt_.synthetic_size / 5, opt_.batch), opt_.seed);
  }
  if (data_.train.count < opt_.batch)
    throw InputError("--batch " + std::to_string(opt_.batch) + " is larger than the training set (" +
                     std::to_string(data_.train.count) + " images)");
  norm_ = compute_normalization(data_.train);
  steps_per_epoch_ = data_.train.count / opt_.batch;
  std::printf("data: %s from %s: %d train, %d test images, %s, mean %.4f std %.4f\n", data_.train.name.c_str(),
              data_dir_.c_str(), data_.train.count, data_.test.count,
              data_.train.channels == 1 ? "grey (replicated to 3 channels)" : "3 channels", norm_.mean[0],
              norm_.stdev[0]);
}

void Trainer::setup_gpu() {
  require_cuda_device();
  CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
  ctx_ = std::make_unique<GpuContext>();
  size_t total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_before_, &total));
  std::printf("gpu: %s (sm_%d%d, %d SMs, %s), cuDNN %zu\n", prop_.name, prop_.major, prop_.minor,
              prop_.multiProcessorCount, format_bytes(total).c_str(), cudnnGetVersion());

  // --deterministic takes algorithms from the heuristics (filtered to deterministic ones): measured
  // choices could differ between runs, and so would the rounding.
  NetConfig cfg;
  cfg.batch = opt_.batch;
  cfg.dtype = kBuild.precision;
  cfg.layout = kBuild.layout;
  cfg.tf32 = opt_.tf32;
  cfg.conv.policy = opt_.deterministic ? AlgoPolicy::Heuristic : kBuild.algo;
  cfg.conv.deterministic = opt_.deterministic;
  cfg.conv.workspace_limit = size_t(opt_.workspace_mb) << 20;
  cfg.conv_api = kBuild.conv_api;
  const bool measure = cfg.conv.policy == AlgoPolicy::Autotune;
  const std::string context = std::string("gpu=") + prop_.name + ";cudnn=" + std::to_string(cudnnGetVersion()) +
                              ";precision=" + dtype_name(cfg.dtype) + ";layout=" + layout_name(cfg.layout) +
                              ";tf32=" + (cfg.tf32 ? "1" : "0") + ";api=" + conv_api_name(cfg.conv_api) + ";workspace_mb=" + std::to_string(opt_.workspace_mb);
  cache_ = std::make_unique<AutotuneCache>(measure ? opt_.autotune_cache : "", context);
  for (const std::string& w : cache_->load()) std::fprintf(stderr, "warning: %s\n", w.c_str());

  net_ = std::make_unique<ResNet50>(cfg, *ctx_, *cache_);
  const AlgoReport& ar = net_->algo_report();
  if (!measure)
    std::printf("convs: %d shapes, algorithms from cuDNN's heuristics%s, %s API, workspace %s\n", ar.shapes,
                opt_.deterministic ? " (deterministic only)" : "", conv_api_name(cfg.conv_api),
                format_bytes(ar.workspace).c_str());
  else if (ar.searched == 0)
    std::printf("convs: all %d shapes from the autotune cache %s (no search), %s API, workspace %s\n", ar.shapes,
                opt_.autotune_cache.c_str(), conv_api_name(cfg.conv_api), format_bytes(ar.workspace).c_str());
  else {
    std::printf("convs: autotuned %d of %d shapes in %.2f s (saved to %s), %s API, workspace %s\n", ar.searched,
                ar.shapes, ar.search_s, opt_.autotune_cache.c_str(), conv_api_name(cfg.conv_api),
                format_bytes(ar.workspace).c_str());
    cache_->save();
  }

  LoaderConfig lc{kBuild.loader, opt_.batch, workers_, kBuild.precision, kBuild.layout, norm_,
                  data_.train.channels, ctx_->stream};
  loader_ = make_loader(lc);
  timing_ = std::make_unique<StepTiming>(ctx_->stream);
  counters_dev_ = DeviceBuffer(sizeof(DeviceCounters), "counters");
  counters_host_ = PinnedBuffer(sizeof(DeviceCounters), "counters");
  counters_read_ = std::make_unique<Event>(false);
  window_start_ = std::make_unique<Event>();
  window_end_ = std::make_unique<Event>();
  if (!opt_.trace.empty()) trace_ = std::make_unique<CuptiTrace>();
}

void Trainer::start_from_checkpoint_or_init() {
  DeviceCounters init{};
  init.train.first_bad_step = init.eval.first_bad_step = -1;
  init.train.last_good_loss = NAN;  // none yet: a run whose first step diverges must not report 0
  init.scaler.scale = kBuild.precision == DType::F16 ? static_cast<float>(opt_.loss_scale) : 1.f;
  ParamStore& p = net_->params();
  if (resume_) {
    std::vector<std::pair<std::string, std::vector<int>>> sig;
    for (const auto& t : p.tensors()) sig.emplace_back(t.name, t.shape);
    CheckpointMeta here;
    here.precision = dtype_name(kBuild.precision);
    here.layout = layout_name(kBuild.layout);
    here.model_signature = model_signature(sig);
    here.params = p.total();
    here.running = net_->running_stats_count();
    here.batch = opt_.batch;
    here.data = data_.train.name;
    check_checkpoint_fits(resume_->meta, here, opt_.resume);
    const Checkpoint& c = *resume_;
    CUDA_CHECK(cudaMemcpy(p.master_all(), c.master.data(), c.master.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p.momentum_all(), c.momentum.data(), c.momentum.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(net_->running_stats(), c.running.data(), c.running.size() * 4, cudaMemcpyHostToDevice));
    p.refresh_working_copy(ctx_->stream);
    step_ = c.meta.step;
    start_epoch_ = c.meta.epoch;
    start_k_ = c.meta.step_in_epoch;
    init.scaler.scale = c.meta.loss_scale;
    init.scaler.good_steps = c.meta.good_steps;
    init.scaler.skipped_steps = c.meta.skipped_steps;
    if (c.meta.seed != opt_.seed || c.meta.epochs != opt_.epochs)
      std::fprintf(stderr, "warning: the checkpoint was made with --seed %llu --epochs %d; continuing with --seed %llu "
                   "--epochs %d changes the data order or learning rate\n", (unsigned long long)c.meta.seed,
                   c.meta.epochs, (unsigned long long)opt_.seed, opt_.epochs);
    std::printf("resumed from %s at step %ld (epoch %d, step %d of it)\n", opt_.resume.c_str(), step_,
                start_epoch_ + 1, start_k_);
    resume_.reset();
  } else {
    net_->init_params(opt_.seed);
  }
  CUDA_CHECK(cudaMemcpy(counters(), &init, sizeof(init), cudaMemcpyHostToDevice));
  last_ = init;
  first_step_ = clean_steps_ = step_;
  save_existed_ = !opt_.save.empty() && access(opt_.save.c_str(), F_OK) == 0;
}

// ---- the loop -----------------------------------------------------------------------------------
int Trainer::run() {
  workers_ = opt_.workers > 0 ? opt_.workers : default_workers();
  name_this_thread("main");
  tty_ = isatty(STDOUT_FILENO) && !opt_.json;
  std::printf("%s\n", describe_build().c_str());
  if (opt_.json) {
    JsonLine j;
    j.add("event", "start").add("variant", kBuild.variant).add("optimizations", kBuild.optimizations())
        .add("settings", settings_json(opt_, workers_));
    std::printf("%s\n", j.str().c_str());
  }
  // Everything the user gave is validated before the GPU is touched.
  load_data();
  if (!opt_.resume.empty()) resume_ = std::make_unique<Checkpoint>(load_checkpoint(opt_.resume));
  setup_gpu();
  start_from_checkpoint_or_init();
  std::printf("model: ResNet-50 (CIFAR stem), %s parameters; batch %d, %d steps per epoch\n",
              with_commas(static_cast<long long>(net_->params().total())).c_str(), opt_.batch, steps_per_epoch_);

  const long total_steps = long(opt_.epochs) * steps_per_epoch_;
  schedule_ = {opt_.lr, opt_.min_lr, std::lround(opt_.warmup_epochs * steps_per_epoch_), total_steps};
  window_first_ = first_step_ + opt_.warmup_steps;
  window_last_ = window_first_ + opt_.profile_steps - 1;
  loss_history_ = DeviceBuffer(size_t(steps_per_epoch_) * sizeof(float), "loss history");

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  try {
    // The starting state is a periodic save point too (step 0 of a fresh run): without it, a run
    // that diverges within its first N steps would have no state to keep.
    if (opt_.save_every > 0 && step_ % opt_.save_every == 0) save(opt_.save, true);
    for (int epoch = start_epoch_; epoch < opt_.epochs && !out_of_steps(); ++epoch)
      if (!train_epoch(epoch)) break;
    if (window_open_) close_window();  // the run ended inside the window
    if (g_stop_requested) {
      const std::string path = opt_.save.empty() ? "interrupted.ckpt" : opt_.save;
      save(path, false);
      std::printf("stopped by a signal after step %ld: checkpoint saved to %s (continue with --resume %s)\n", step_,
                  path.c_str(), path.c_str());
      summary();
      return 0;
    }
    if (opt_.eval && evaluated_at_ != step_) evaluate();  // stopped by --steps inside an epoch
    if (!opt_.save.empty()) {
      save(opt_.save, false);
      std::printf("checkpoint saved to %s\n", opt_.save.c_str());
    }
  } catch (const Diverged& d) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s%s\n", d.what(), what_save_keeps().c_str());
    return 1;
  }
  summary();
  return 0;
}

// Returns false when the run should stop (signal).
bool Trainer::train_epoch(int epoch) {
  epoch_now_ = epoch;
  const EpochPlan plan = train_plan(data_.train, opt_.batch, opt_.seed, epoch);
  const int first = epoch == start_epoch_ ? start_k_ : 0;
  loader_->begin_pass(data_.train, plan, first);
  // The sums are per epoch; the latest finite loss is not (last_ is current: the previous epoch
  // ended with read_counters_now()).
  LossTotals fresh{};
  fresh.first_bad_step = -1;
  fresh.last_good_loss = last_.train.last_good_loss;
  CUDA_CHECK(cudaMemcpy(&counters()->train, &fresh, sizeof(fresh), cudaMemcpyHostToDevice));
  if (!opt_.sample_png.empty() && epoch == start_epoch_) {
    std::vector<uint8_t> u8(data_.train.image_bytes() * opt_.batch);
    std::vector<int32_t> labels(opt_.batch);
    assemble_batch_u8(data_.train, plan, first, kBuild.layout, u8.data(), labels.data());
    write_sample_grid(opt_.sample_png, u8.data(), std::min(opt_.batch, 64), data_.train.channels, kBuild.layout);
    std::printf("wrote the first augmented batch to %s\n", opt_.sample_png.c_str());
  }

  Event start, end;
  const auto wall0 = std::chrono::steady_clock::now();
  start.record(ctx_->stream);
  progress_t0_ = wall0;
  progress_step0_ = step_;
  const long epoch_first_step = step_;
  int k = first;
  for (; k < plan.steps && !out_of_steps() && !g_stop_requested; ++k) {
    k_now_ = k;
    train_step(k);
    if (opt_.save_every > 0 && step_ % opt_.save_every == 0) save(opt_.save, true);
  }
  end.record(ctx_->stream);
  read_counters_now();
  const double train_ms = end.ms_since(start);
  const double stall_ms = timing_->stall_ms(epoch_first_step, step_ - 1, true);
  timing_->drop_before(window_done_ ? step_ : std::min(step_, window_first_));
  if (!opt_.loss_log.empty()) write_loss_log(epoch_first_step, step_ - epoch_first_step);
  if (tty_) progress_line(true);
  final_train_loss_ = mean_loss(last_.train);
  final_train_acc_ = accuracy(last_.train);
  if (g_stop_requested) return false;
  if (k < plan.steps) return true;  // --steps ended the run inside this epoch
  if (opt_.eval) evaluate();
  epoch_report(epoch, std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(), train_ms,
               stall_ms);
  return true;
}

void Trainer::train_step(int k) {
  const long s = step_;
  if (s == window_first_) open_window();
  {
    NvtxRange step_range("step " + std::to_string(s), phase_color::kGrey);
    timing_->begin_step(s);
    {
      NvtxRange r("get batch", phase_color::kRed);
      loader_->get(k);
    }
    DeviceBatch batch;
    {
      NvtxRange r("copy batch", phase_color::kYellow);
      batch = loader_->copy(k);
    }
    timing_->data_ready();
    {
      NvtxRange r("forward", phase_color::kGreen);
      net_->forward(batch.images, true);
      net_->loss(batch.labels, &counters()->train, &counters()->scaler.scale, s);
      // keep this step's loss for --loss-log, without a sync
      CUDA_CHECK(cudaMemcpyAsync(loss_history_.as<float>() + k, &counters()->train.last_loss, sizeof(float),
                                 cudaMemcpyDeviceToDevice, ctx_->stream));
    }
    {
      NvtxRange r("backward", phase_color::kPurple);
      net_->backward();
    }
    {
      NvtxRange r("optimizer step", phase_color::kBlue);
      optimizer_step(schedule_.at(s));
    }
    ++step_;
    {
      NvtxRange r("loss stats", phase_color::kCyan);
      loss_stats();
    }
  }
  if (s == window_last_) close_window();
}

void Trainer::optimizer_step(double lr) {
  ParamStore& p = net_->params();
  const SgdArgs a{p.master_all(), p.momentum_all(), p.weight_grads_all(), p.vector_grads_all(), p.working_copy(),
                  p.total(), p.weight_count(), p.act(), static_cast<float>(lr), static_cast<float>(opt_.momentum),
                  static_cast<float>(opt_.weight_decay), opt_.nesterov};
  ScalerState* scaler = &counters()->scaler;
  check_grads_finite(a, scaler, ctx_->stream);
  sgd_update(a, scaler, ctx_->stream);
  loss_scale_update(scaler, kBuild.precision == DType::F16, opt_.loss_scale_window, ctx_->stream);
}

// Baseline: a synchronising copy every step (the seed's `loss.item()`). On-device accumulation: the
// counters stay on the GPU and are read asynchronously every --progress-every steps.
void Trainer::loss_stats() {
  if (!kBuild.device_loss) {
    CUDA_CHECK(cudaMemcpy(&last_, counters(), sizeof(DeviceCounters), cudaMemcpyDeviceToHost));
    take_counters(last_, step_);
    if (tty_ && step_ % opt_.progress_every == 0) progress_line(false);
    return;
  }
  if (step_ % opt_.progress_every != 0) return;
  if (read_in_flight_) {
    const cudaError_t q = cudaEventQuery(*counters_read_);
    if (q == cudaErrorNotReady) return;  // the previous read has not landed: never wait here
    CUDA_CHECK(q);
    last_ = *counters_host_.as<DeviceCounters>();
    read_in_flight_ = false;
    take_counters(last_, read_covers_);
    if (tty_) progress_line(false);
  }
  CUDA_CHECK(cudaMemcpyAsync(counters_host_.get(), counters(), sizeof(DeviceCounters), cudaMemcpyDeviceToHost,
                             ctx_->stream));
  counters_read_->record(ctx_->stream);
  read_in_flight_ = true;
  read_covers_ = step_;
}

void Trainer::read_counters_now() {
  CUDA_CHECK(cudaMemcpyAsync(counters_host_.get(), counters(), sizeof(DeviceCounters), cudaMemcpyDeviceToHost,
                             ctx_->stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  read_in_flight_ = false;
  last_ = *counters_host_.as<DeviceCounters>();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  peak_mem_mb_ = std::max(peak_mem_mb_, double(free_before_ - std::min(free_before_, free_b)) / (1 << 20));
  take_counters(last_, step_);
}

// Every read of the counters goes through here, with the number of steps it covers: it stops a
// diverged run, and it is what proves a pending periodic save good.
void Trainer::take_counters(const DeviceCounters& c, long steps) {
  check_divergence(c, steps);
  clean_steps_ = std::max(clean_steps_, steps);
  if (pending_save_proven(pending_, steps, c.scaler.skipped_steps, c.scaler.diverged != 0)) commit_pending();
}

// Steps are named 0-based, as --loss-log numbers them. The GPU records the first step whose loss
// was not finite; a gradient divergence is only known to lie after the last read that found none.
void Trainer::check_divergence(const DeviceCounters& c, long steps) const {
  const bool fp16 = kBuild.precision == DType::F16;
  if (c.train.first_bad_step < 0 && !c.scaler.diverged) return;
  if (fp16 && !c.scaler.diverged) return;  // an fp16 overflow: the scaler skipped that step
  char last[64] = "no finite loss in this run";
  if (!std::isnan(c.train.last_good_loss))
    std::snprintf(last, sizeof(last), "last finite loss %.6g", c.train.last_good_loss);
  char at[64];
  if (c.train.first_bad_step >= 0) std::snprintf(at, sizeof(at), "step %lld", c.train.first_bad_step);
  else if (steps - 1 == clean_steps_) std::snprintf(at, sizeof(at), "step %ld", steps - 1);
  else std::snprintf(at, sizeof(at), "one of steps %ld to %ld", clean_steps_, steps - 1);
  char msg[512];
  if (c.train.first_bad_step >= 0)
    std::snprintf(msg, sizeof(msg), "training diverged: the loss became NaN/Inf at %s (%s); stopping without saving",
                  at, last);
  else
    std::snprintf(msg, sizeof(msg), "training diverged at %s: non-finite gradients%s (%s); stopping without saving",
                  at, fp16 ? " even at a tiny loss scale" : "", last);
  throw Diverged(msg);
}

// After a divergence: the pending save is unproven, so it goes; FILE holds the last proven state.
std::string Trainer::what_save_keeps() {
  if (opt_.save.empty()) return "";
  if (opt_.save_every > 0) std::remove(pending_path().c_str());
  pending_ = {};
  if (kept_step_ >= 0)
    return "; " + opt_.save + " keeps its last good state (step " + std::to_string(kept_step_) + ")";
  if (!save_existed_)
    return std::string("; no checkpoint was kept") +
           (opt_.save_every > 0 ? " (no periodic save was shown good before the divergence)" : "");
  if (opt_.resume == opt_.save)
    return "; " + opt_.save + " keeps the state this run resumed from (step " + std::to_string(first_step_) + ")";
  return "; " + opt_.save + " keeps what it held before this run";
}

void Trainer::evaluate() {
  NvtxRange range("evaluation", phase_color::kGrey);
  const EpochPlan plan = eval_plan(data_.test, opt_.batch);
  loader_->begin_pass(data_.test, plan, 0);
  CUDA_CHECK(cudaMemsetAsync(&counters()->eval, 0, sizeof(LossTotals), ctx_->stream));
  for (int k = 0; k < plan.steps; ++k) {
    loader_->get(k);
    const DeviceBatch b = loader_->copy(k);
    net_->forward(b.images, false);
    net_->loss(b.labels, &counters()->eval, nullptr, -1);
  }
  read_counters_now();
  final_test_loss_ = mean_loss(last_.eval);
  final_test_acc_ = accuracy(last_.eval);
  evaluated_at_ = step_;
}

// ---- measurement window -------------------------------------------------------------------------
void Trainer::open_window() {
  // Open it on an idle GPU. The host runs a step or more ahead, and work launched before the window
  // would otherwise run inside it: timed by the window's events, but not recorded by --trace (CUPTI
  // records only what is launched while it records), so the trace would count that time as idle
  // and read a lower GPU busy % than nsys on the same binary.
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaProfilerStart());
  if (trace_) trace_->start();
  window_start_->record(ctx_->stream);
  window_open_ = true;
}

void Trainer::close_window() {
  window_end_->record(ctx_->stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  CUDA_CHECK(cudaProfilerStop());
  window_open_ = false;
  window_done_ = true;
  window_ms_ = window_end_->ms_since(*window_start_);
  window_stall_ms_ = timing_->stall_ms(window_first_, step_ - 1, true);
  window_last_ = step_ - 1;  // the steps actually in it
  if (trace_) {
    trace_->stop();
    const TraceSummary t = trace_->summary();
    gpu_busy_pct_ = t.gpu_busy_pct;
    trace_->write_chrome_json(opt_.trace);
    std::printf("trace: %s written (open it in https://ui.perfetto.dev)\n%s", opt_.trace.c_str(), t.report().c_str());
  }
}

// ---- checkpoints --------------------------------------------------------------------------------
// A periodic save goes to FILE.pending and becomes FILE once proven (take_counters); the end-of-run
// and signal saves are the result asked for and go to `path` directly.
void Trainer::save(const std::string& path, bool periodic) {
  NvtxRange range("save checkpoint", phase_color::kGrey);
  CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  const ParamStore& p = net_->params();
  Checkpoint c;
  std::vector<std::pair<std::string, std::vector<int>>> sig;
  for (const auto& t : p.tensors()) sig.emplace_back(t.name, t.shape);
  DeviceCounters now{};
  CUDA_CHECK(cudaMemcpy(&now, counters(), sizeof(now), cudaMemcpyDeviceToHost));
  take_counters(now, step_);  // a diverged state is never saved; an older pending save may be proven
  // A pending save that this read does not prove has had every step since skipped (or none run):
  // it holds the weights saved now, so dropping it loses nothing, and FILE keeps a proven state.
  if (pending_.step >= 0) {
    if (!periodic) std::remove(pending_path().c_str());  // a periodic save overwrites it below
    pending_ = {};
  }
  CheckpointMeta& m = c.meta;
  m.precision = dtype_name(kBuild.precision);
  m.layout = layout_name(kBuild.layout);
  m.model_signature = model_signature(sig);
  m.params = p.total();
  m.running = net_->running_stats_count();
  m.data = data_.train.name;
  m.batch = opt_.batch;
  m.epochs = opt_.epochs;
  m.seed = opt_.seed;
  m.step = step_;
  m.epoch = static_cast<int>(step_ / steps_per_epoch_);
  m.step_in_epoch = static_cast<int>(step_ % steps_per_epoch_);
  m.loss_scale = now.scaler.scale;
  m.good_steps = now.scaler.good_steps;
  m.skipped_steps = now.scaler.skipped_steps;
  c.master.resize(p.total());
  c.momentum.resize(p.total());
  c.running.resize(net_->running_stats_count());
  CUDA_CHECK(cudaMemcpy(c.master.data(), p.master_all(), c.master.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(c.momentum.data(), p.momentum_all(), c.momentum.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(c.running.data(), net_->running_stats(), c.running.size() * 4, cudaMemcpyDeviceToHost));
  if (!periodic) {
    save_checkpoint(path, c);
    return;
  }
  save_checkpoint(pending_path(), c);  // atomic: FILE.pending is whole or absent (a leftover is overwritten)
  pending_ = {step_, now.scaler.skipped_steps};
}

void Trainer::commit_pending() {
  // rename() is atomic: FILE is the old proven state or the new one, whatever happens meanwhile.
  if (std::rename(pending_path().c_str(), opt_.save.c_str()) != 0)
    throw Fatal(pending_path() + ": cannot rename to " + opt_.save + ": " + std::strerror(errno));
  kept_step_ = pending_.step;
  pending_ = {};
}

void Trainer::write_loss_log(long first_step, long count) {
  std::vector<float> losses(count);
  const int k0 = static_cast<int>(first_step % steps_per_epoch_);
  CUDA_CHECK(cudaMemcpy(losses.data(), loss_history_.as<float>() + k0, count * sizeof(float), cudaMemcpyDeviceToHost));
  std::ofstream out(opt_.loss_log, first_step == first_step_ ? std::ios::trunc : std::ios::app);
  if (!out) throw InputError(opt_.loss_log + ": cannot write the loss log");
  char line[64];
  for (long i = 0; i < count; ++i) {
    std::snprintf(line, sizeof(line), "%ld %.9g\n", first_step + i, losses[i]);  // %.9g: exact for floats
    out << line;
  }
}

// ---- reports ------------------------------------------------------------------------------------
void Trainer::progress_line(bool final) {
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - progress_t0_).count();
  const double ips = dt > 0 ? double(step_ - progress_step0_) * opt_.batch / dt : 0;
  const long left = (opt_.steps > 0 ? std::min(opt_.steps, long(opt_.epochs) * steps_per_epoch_)
                                    : long(opt_.epochs) * steps_per_epoch_) - step_;
  const double eta = ips > 0 ? double(left) * opt_.batch / ips : 0;
  std::printf("\r  epoch %d/%d  step %d/%d  %s img/s  loss %.4f  ETA %s   ", epoch_now_ + 1, opt_.epochs,
              k_now_ + 1, steps_per_epoch_, with_commas(std::lround(ips)).c_str(), mean_loss(last_.train),
              clock_text(eta).c_str());
  if (final) std::printf("\r%*s\r", 90, "");
  std::fflush(stdout);
}

void Trainer::epoch_report(int epoch, double seconds, double train_ms, double stall_ms) {
  const long steps = static_cast<long>(last_.train.count / opt_.batch);
  const double ips = train_ms > 0 ? double(steps) * opt_.batch / (train_ms / 1e3) : NAN;
  const double stall_pct = train_ms > 0 ? 100.0 * stall_ms / train_ms : NAN;
  const double lr = schedule_.at(step_ - 1);
  if (opt_.json) {
    JsonLine j;
    j.add("event", "epoch").add("epoch", epoch + 1).add("epochs", opt_.epochs).add("step", step_)
        .add("train_loss", final_train_loss_).add("train_acc", final_train_acc_);
    if (opt_.eval) j.add("test_loss", final_test_loss_).add("test_acc", final_test_acc_);
    else j.null("test_loss").null("test_acc");
    j.add("epoch_time_s", seconds).add("train_time_s", train_ms / 1e3).add("images_per_s", ips)
        .add("data_stall_pct", stall_pct).add("lr", lr)
        .add("loss_scale", static_cast<double>(last_.scaler.scale)).add("skipped_steps", last_.scaler.skipped_steps);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("epoch %2d/%d  train loss %.4f acc %6.2f%%", epoch + 1, opt_.epochs, final_train_loss_,
                100 * final_train_acc_);
    if (opt_.eval) std::printf("  test loss %.4f acc %6.2f%%", final_test_loss_, 100 * final_test_acc_);
    std::printf("  %.1f s  %s img/s  stall %.1f%%  lr %.4f\n", seconds, with_commas(std::lround(ips)).c_str(),
                stall_pct, lr);
  }
  std::fflush(stdout);
}

void Trainer::summary() {
  const long timed = window_done_ ? window_last_ - window_first_ + 1 : 0;
  const double ips = timed > 0 ? double(timed) * opt_.batch / (window_ms_ / 1e3) : NAN;
  const double ms_step = timed > 0 ? window_ms_ / double(timed) : NAN;
  const double stall = timed > 0 ? 100.0 * window_stall_ms_ / window_ms_ : NAN;
  const AlgoReport& ar = net_->algo_report();
  if (opt_.json) {
    JsonLine j;
    j.add("event", "summary").add("variant", kBuild.variant).add("optimizations", kBuild.optimizations())
        .add("settings", settings_json(opt_, workers_)).add("gpu", prop_.name)
        .add("cudnn", static_cast<unsigned long>(cudnnGetVersion())).add("batch", opt_.batch)
        .add("data", data_.train.name).add("steps", step_ - first_step_).add("warmup_steps", opt_.warmup_steps)
        .add("timed_steps", timed).add("images_per_s", ips).add("ms_per_step", ms_step)
        .add("data_stall_pct", stall).add("gpu_busy_pct", gpu_busy_pct_).add("peak_gpu_mem_mb", peak_mem_mb_)
        .add("final_loss", final_train_loss_).add("final_train_acc", final_train_acc_)
        .add("final_test_loss", final_test_loss_).add("final_test_acc", final_test_acc_)
        .add("params", static_cast<unsigned long>(net_->params().total())).add("autotune_s", ar.search_s)
        .add("skipped_steps", last_.scaler.skipped_steps).add("date", today());
    std::printf("%s\n", j.str().c_str());
    return;
  }
  std::printf("summary: %ld steps", step_ - first_step_);
  if (timed > 0)
    std::printf("; steady state (%ld steps after %d warm-up): %s img/s, %.2f ms/step, data stall %.1f%%", timed,
                opt_.warmup_steps, with_commas(std::lround(ips)).c_str(), ms_step, stall);
  if (!std::isnan(final_test_acc_)) std::printf("; test accuracy %.2f%%", 100 * final_test_acc_);
  std::printf("; peak GPU memory %.0f MiB\n", peak_mem_mb_);
}

}  // namespace

std::string describe_build() {
  std::string opts;
  for (const std::string& o : kBuild.optimizations()) opts += (opts.empty() ? "" : " ") + o;
  return std::string(kBuild.variant) + ": optimizations [" + (opts.empty() ? "none: the baseline" : opts) + "] -> " +
         dtype_name(kBuild.precision) + ", " + layout_name(kBuild.layout) + ", " + loader_name(kBuild.loader) +
         " loader, " + algo_policy_name(kBuild.algo) + " conv algorithms (cuDNN " + conv_api_name(kBuild.conv_api) +
         " API), loss read " +
         (kBuild.device_loss ? "asynchronously from the GPU" : "every step (synchronising)");
}

int train_main(const Options& opt) {
  Trainer t(opt);
  return t.run();
}
