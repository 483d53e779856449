// The training program. One step is:
//   get batch -> copy batch -> forward (+ loss) -> backward -> optimizer step -> loss stats
// each inside its NVTX range, all inside "step N"; with CUDA graphs, forward to optimizer step are
// one launch in a range "step graph". What each optimization of the ladder changes is asked of the
// BuildSettings here and nowhere else but the loader and network configs. The pieces with a life
// of their own are units of their own: the step's GPU work (step.h) and its graph (step_graph.h),
// the counters and divergence (counters.h), saves (checkpointing.h), the steady-state window
// (window.h), the printed reports (reports.h) and, on several GPUs, data parallelism
// (dist/data_parallel.h: this file only calls it at a few points).
#include "train/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/handles.h"
#include "core/late_notice.h"
#include "data/augment.h"
#include "data/data_choice.h"
#include "data/image_decode.h"
#include "data/sample_grid.h"
#include "dist/data_parallel.h"
#include "measure/profiling.h"
#include "measure/step_timing.h"
#include "model/autotune_cache.h"
#include "model/resnet50.h"
#include "model/resnet50_spec.h"
#include "pipeline/loader.h"
#include "train/checkpointing.h"
#include "train/counters.h"
#include "train/data_parallel_setup.h"
#include "train/reports.h"
#include "train/schedule.h"
#include "train/step.h"
#include "train/step_graph.h"
#include "train/window.h"

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

// Ranks other than 0 print nothing but their errors (stderr).
void silence_stdout() {
  std::fflush(stdout);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDOUT_FILENO);
    ::close(null_fd);
  }
}

// A file of the run's output (the loss log) could not be written: the weights are fine, so they are
// saved before the run stops.
struct OutputFailed : Fatal {
  using Fatal::Fatal;
};

double mean_loss(const LossTotals& t) { return t.count ? t.loss_sum / double(t.count) : NAN; }
double accuracy(const LossTotals& t) { return t.count ? double(t.correct) / double(t.count) : NAN; }

class Trainer {
 public:
  Trainer(const BuildSettings& b, const Options& o)
      : build_(b), opt_(o), launch_(discover_launch()), workers_(o.workers > 0 ? o.workers : default_workers()),
        report_(b, opt_, workers_, isatty(STDOUT_FILENO) && !o.json, launch_.world), saves_(opt_),
        divergence_(b.precision == DType::F16) {}
  int run();
  // This rank stops with an error: the other ranks are told; returns the line to print.
  std::string failed(const std::string& why) {
    if (dp_) dp_->fail(why);
    return rank_prefix() + why;
  }

 private:
  void check_output_paths() const;
  void load_data();
  void join_ranks();
  void check_resume();
  NetConfig net_config() const;
  void setup_gpu();
  void build_network();
  void start_from_checkpoint_or_init();
  bool train_epoch(int epoch);
  void write_sample_png(const EpochPlan& plan, int first) const;
  void train_step(int k);
  void open_window();
  void close_window();
  StepTargets step_targets() const;
  SgdSettings sgd_settings() const;
  void loss_stats();
  void take(const CounterRead& r);
  void read_counters_now();
  void evaluate();
  void save(const std::string& path, bool periodic);
  void write_loss_log(long first_step, long count) const;
  RunSummary summary() const;
  bool out_of_steps() const { return opt_.steps > 0 && step_ >= opt_.steps; }
  // Where a run that stops early (a signal, a failed output, an image that does not decode) saves.
  std::string stop_save_path() const { return opt_.save.empty() ? "interrupted.ckpt" : opt_.save; }
  // Data parallel: images per step over all ranks, this rank's part of a pass, the signal check
  // every rank agrees on, and whether this rank writes files (rank 0 alone does).
  int global_batch() const { return opt_.batch * launch_.world; }
  EpochPlan my_part(EpochPlan p) const { return launch_.distributed() ? shard_plan(std::move(p), launch_.rank, launch_.world) : p; }
  bool stop_requested();
  bool writes() const { return launch_.is_root(); }
  std::string rank_prefix() const { return launch_.distributed() ? "rank " + std::to_string(launch_.rank) + ": " : ""; }
  // A warning every rank finds alike (about the data, the checkpoint) is printed by rank 0 alone: N
  // ranks would print it N times. One about a file of this machine (the autotune cache) is printed
  // by each machine's first rank, with its rank.
  void warn_once(const std::string& w) const {
    if (launch_.is_root()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  void warn_once_per_machine(const std::string& w) const {
    if (launch_.local_rank == 0) std::fprintf(stderr, "%swarning: %s\n", rank_prefix().c_str(), w.c_str());
  }
  void average_running_stats() {
    if (dp_) dp_->average(net_->running_stats(), net_->running_stats_count());
  }

  const BuildSettings& build_;
  Options opt_;
  LaunchInfo launch_;
  int workers_;
  Reporter report_;
  SaveKeeper saves_;
  DivergenceWatch divergence_;
  // data
  ChosenData data_;
  Normalization norm_{};
  int steps_per_epoch_ = 0;
  std::unique_ptr<Checkpoint> resume_;
  // GPU
  std::unique_ptr<GpuContext> ctx_;
  cudaDeviceProp prop_{};
  size_t free_before_ = 0;
  double peak_mem_mb_ = 0;
  std::unique_ptr<AutotuneCache> cache_;
  std::unique_ptr<ResNet50> net_;
  std::unique_ptr<DataParallel> dp_;  // several ranks only
  CheckpointMeta meta_;  // what this run's checkpoints record
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<StepParamsOnDevice> step_params_;
  std::unique_ptr<StepGraph> step_graph_;
  std::unique_ptr<StepTiming> timing_;
  std::unique_ptr<CounterReader> counters_;
  DeviceCounters last_{};  // the latest counters the host has seen
  std::unique_ptr<SteadyStateWindow> window_;
  DeviceBuffer loss_history_;
  // position
  LrSchedule schedule_;
  long step_ = 0;          // steps done in all
  long first_step_ = 0;    // step_ when this process started
  int start_epoch_ = 0, start_k_ = 0;
  int epoch_now_ = 0, k_now_ = 0;
  // results
  double final_test_loss_ = NAN, final_test_acc_ = NAN, final_train_loss_ = NAN, final_train_acc_ = NAN;
  long evaluated_at_ = -1;  // step_ at the last evaluation
  bool stopping_ = false;   // a signal stops the run (on every rank at the same step)
  double allreduce_exposed_ms_ = NAN;  // per step of the window, several ranks only
};

// ---- set-up -------------------------------------------------------------------------------------
// Every file the run will write is checked before the data is loaded and the GPU is touched: a path
// found bad only when it is written would cost the run (the end-of-run save, the first loss log).
void Trainer::check_output_paths() const {
  const bool cache_written = build_.algo == AlgoPolicy::Autotune && !opt_.deterministic;
  if (cache_written) check_files_distinct(opt_, true);  // parse_options checked the files but the cache
  for (const auto& [flag, path] : output_files(opt_, cache_written))
    if (!path.empty()) check_output_path(path, flag);
}

void Trainer::load_data() {
  ImageOptions images;
  images.side = opt_.image_size;
  images.skip_bad = opt_.skip_bad_images;
  images.cache_decoded = opt_.cache_decoded;
  images.threads = workers_;
  data_ = load_data_set(opt_.data, opt_.data_dir, opt_.synthetic_size, global_batch(), opt_.seed, images);
  const Dataset& train = data_.split.train;
  if (train.classes() > kSoftmaxMaxClasses)
    throw InputError(data_.dir + ": " + std::to_string(train.classes()) + " classes; the loss kernel takes at most " +
                     std::to_string(kSoftmaxMaxClasses));
  norm_ = compute_normalization(train, workers_);
  steps_per_epoch_ = train.count / global_batch();
  for (const std::string& w : data_.warnings) warn_once(w);
  if (!norm_.warning.empty()) warn_once(norm_.warning);
  const char* channels = train.channels == 1 ? "grey (replicated to 3 channels)" : "3 channels";
  if (train.name != "folder") {
    std::printf("data: %s from %s: %d train, %d test images, %s, mean %.4f std %.4f\n", train.name.c_str(),
                data_.dir.c_str(), train.count, data_.split.test.count, channels, norm_.mean[0], norm_.stdev[0]);
    return;
  }
  std::printf("data: folder %s: %s train, %s test images, %d classes, %dx%d, %s, %s\n", data_.dir.c_str(),
              with_commas(train.count).c_str(), with_commas(data_.split.test.count).c_str(), train.classes(), train.side,
              train.side, channels,
              train.decoded_on_demand ? (build_.loader == LoaderKind::PinnedRing ? "decoded every epoch by the loader threads"
                                                                                 : "decoded every epoch on the main thread")
                                      : "decoded once into memory");
  for (const std::string& n : data_.notes) std::printf("%s\n", n.c_str());
  std::printf("normalisation: mean %.4f %.4f %.4f, std %.4f %.4f %.4f, from %s\n", norm_.mean[0], norm_.mean[1],
              norm_.mean[2], norm_.stdev[0], norm_.stdev[1], norm_.stdev[2],
              norm_.images < train.count ? ("a sample of " + with_commas(norm_.images) + " of the " +
                                            with_commas(train.count) + " training images").c_str()
                                         : ("all " + with_commas(train.count) + " training images").c_str());
}

// Several ranks: meet the others (the run is refused if any was started differently), take this
// rank's GPU and join the NCCL communicator, before anything else is put on the GPU.
void Trainer::join_ranks() {
  if (resume_) check_global_batch(resume_->meta, opt_.batch, launch_.world, opt_.resume);
  const Fingerprint f = run_fingerprint(build_, opt_, launch_.world, data_.split, norm_, resume_.get());
  dp_ = std::make_unique<DataParallel>(launch_, f, data_parallel_config(build_, opt_));
}

// The checkpoint to resume from must fit this build, model, batch, data set and training set size:
// all of it is known without the GPU (the model from its CPU listing).
void Trainer::check_resume() {
  meta_ = run_meta(build_, resnet50_params(net_config()), data_.split.train, opt_);
  meta_.batch = global_batch();  // what a resume on another number of GPUs must keep
  if (opt_.resume.empty()) return;
  resume_ = std::make_unique<Checkpoint>(load_checkpoint(opt_.resume));
  check_checkpoint_fits(resume_->meta, meta_, opt_.resume);
  check_checkpoint_position(resume_->meta, steps_per_epoch_, opt_.resume);
}

NetConfig Trainer::net_config() const {
  NetConfig cfg;
  cfg.batch = opt_.batch;
  cfg.dtype = build_.precision;
  cfg.layout = build_.layout;
  cfg.tf32 = opt_.tf32;
  cfg.conv.policy = opt_.deterministic ? AlgoPolicy::Heuristic : build_.algo;
  cfg.conv.deterministic = opt_.deterministic;
  cfg.conv.workspace_limit = size_t(opt_.workspace_mb) << 20;
  cfg.conv_api = build_.conv_api;
  cfg.fused_bn = build_.fused_bn;
  cfg.unfused_patterns = opt_.no_fuse_patterns;
  cfg.wgrad_beside = build_.wgrad_stream;
  cfg.classes = data_.split.train.classes();
  cfg.image_side = data_.split.train.side;
  return cfg;
}

void Trainer::setup_gpu() {
  require_cuda_device();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
  ctx_ = std::make_unique<GpuContext>();
  size_t total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_before_, &total));
  std::printf("gpu: %s (sm_%d%d, %d SMs, %s), cuDNN %zu\n", prop_.name, prop_.major, prop_.minor,
              prop_.multiProcessorCount, format_bytes(total).c_str(), cudnnGetVersion());
  build_network();
  if (dp_) {
    dp_->attach(net_->params(), ctx_->stream);
    net_->on_grad_ready = [dp = dp_.get()](int param) { dp->on_grad_ready(param); };
    std::printf("data parallel: %s; --batch %d per GPU, %d per step\n", dp_->describe().c_str(), opt_.batch,
                global_batch());
  }
  LoaderConfig lc{build_.loader, opt_.batch, workers_, build_.precision, build_.layout, norm_,
                  data_.split.train.channels, data_.split.train.side, ctx_->stream};
  loader_ = make_loader(lc);
  step_params_ = std::make_unique<StepParamsOnDevice>(ctx_->stream);
  step_graph_ = std::make_unique<StepGraph>(*ctx_, opt_.batch, build_.cuda_graph, opt_.cuda_graph);
  step_graph_->drop_memsets_into(net_->statistics_kept_zero());
  if (build_.cuda_graph) std::printf("step: %s\n", step_graph_->describe().c_str());
  timing_ = std::make_unique<StepTiming>(ctx_->stream);
  counters_ = std::make_unique<CounterReader>(ctx_->stream);
}

// The network, with its conv algorithms chosen. --deterministic takes them from the heuristics
// (filtered to deterministic ones): measured choices could differ between runs, and so would the
// rounding.
void Trainer::build_network() {
  const NetConfig cfg = net_config();
  const bool measure = cfg.conv.policy == AlgoPolicy::Autotune;
  const AutotuneContext context{prop_.name, cudnnGetVersion(), cfg.dtype, cfg.layout, cfg.tf32, cfg.conv_api,
                                opt_.workspace_mb};
  cache_ = std::make_unique<AutotuneCache>(measure ? opt_.autotune_cache : "", context);
  for (const std::string& w : cache_->load()) warn_once_per_machine(w);

  const auto start = std::chrono::steady_clock::now();
  if (measure) cache_->arm_late_notice(kLateNoticeDelay);
  net_ = std::make_unique<ResNet50>(cfg, *ctx_, *cache_);
  cache_->end_late_notice();
  const double build_s = seconds_since(start);
  const AlgoReport& ar = net_->algo_report();
  const char* api = conv_api_name(cfg.conv_api);
  std::string ws = format_bytes(ar.workspace);
  if (ar.lane_workspace) ws += " + " + format_bytes(ar.lane_workspace) + " for the weight gradients' stream";
  if (!measure)
    std::printf("convs: %d shapes, algorithms from cuDNN's heuristics%s, %s API, workspace %s\n", ar.shapes,
                opt_.deterministic ? " (deterministic only)" : "", api, ws.c_str());
  else if (ar.searched == 0)
    std::printf("convs: all %d shapes from the autotune cache %s (no search; network built in %.1f s), %s API, "
                "workspace %s\n", ar.shapes, opt_.autotune_cache.c_str(), build_s, api, ws.c_str());
  else {
    std::printf("convs: autotuned %d of %d shapes in %.2f s (saved to %s), %s API, workspace %s\n", ar.searched,
                ar.shapes, ar.search_s, opt_.autotune_cache.c_str(), api, ws.c_str());
  }
  if (cfg.fused_bn)
    for (const std::string& line : fusion_report_lines(net_->fusion_report())) std::printf("%s\n", line.c_str());
  else if (cfg.unfused_patterns)
    warn_once(kNoFuseWithoutFusion);
  if (measure && writes() && cache_->changed()) cache_->save();  // new conv choices or fused plans
}

void Trainer::start_from_checkpoint_or_init() {
  DeviceCounters init = initial_counters(build_.precision == DType::F16 ? static_cast<float>(opt_.loss_scale) : 1.f);
  if (resume_) {
    const Checkpoint& c = *resume_;
    restore_checkpoint(*net_, c, ctx_->stream);
    step_ = c.meta.step;
    start_epoch_ = c.meta.epoch;
    start_k_ = c.meta.step_in_epoch;
    init.scaler.scale = c.meta.loss_scale;
    init.scaler.good_steps = c.meta.good_steps;
    init.scaler.skipped_steps = c.meta.skipped_steps;
    if (c.meta.seed != opt_.seed || c.meta.epochs != opt_.epochs)
      warn_once("the checkpoint was made with --seed " + std::to_string(c.meta.seed) + " --epochs " +
                std::to_string(c.meta.epochs) + "; continuing with --seed " + std::to_string(opt_.seed) + " --epochs " +
                std::to_string(opt_.epochs) + " changes the data order or learning rate");
    std::printf("resumed from %s at step %ld (epoch %d, step %d of it)\n", opt_.resume.c_str(), step_,
                start_epoch_ + 1, start_k_);
    resume_.reset();
  } else {
    net_->init_params(opt_.seed);
  }
  if (dp_) {  // every rank starts from rank 0's state, bit for bit
    ParamStore& p = net_->params();
    dp_->broadcast_from_root(p.master_all(), p.total() * sizeof(float));
    dp_->broadcast_from_root(p.momentum_all(), p.total() * sizeof(float));
    dp_->broadcast_from_root(net_->running_stats(), net_->running_stats_count() * sizeof(float));
    p.refresh_working_copy(ctx_->stream);
  }
  counters_->set(init);
  last_ = init;
  first_step_ = step_;
  divergence_.start_at(step_);
}

// ---- the loop -----------------------------------------------------------------------------------
// The run's whole life in order, and each way it stops (done, signal, divergence, a failed output, an
// image that does not decode) beside the others: about 70 lines, kept together to be read as one.
int Trainer::run() {
  name_this_thread("main");
  if (!writes()) silence_stdout();
  report_.start();
  // Everything the user gave is validated before the GPU is touched.
  check_output_paths();
  load_data();
  check_resume();
  if (launch_.distributed()) join_ranks();
  setup_gpu();
  start_from_checkpoint_or_init();
  std::printf("model: ResNet-50 (CIFAR stem), %s parameters; batch %d, %d steps per epoch\n",
              with_commas(static_cast<long long>(net_->params().total())).c_str(), global_batch(), steps_per_epoch_);

  const long total_steps = long(opt_.epochs) * steps_per_epoch_;
  schedule_ = {opt_.lr, opt_.min_lr, std::lround(opt_.warmup_epochs * steps_per_epoch_), total_steps};
  window_ = std::make_unique<SteadyStateWindow>(ctx_->stream, first_step_ + opt_.warmup_steps, opt_.profile_steps,
                                                writes() ? opt_.trace : "");
  loss_history_ = DeviceBuffer(size_t(steps_per_epoch_) * sizeof(float), "loss history");

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  try {
    // The starting state is a periodic save point too (step 0 of a fresh run): without it, a run
    // that diverges within its first N steps would have no state to keep.
    if (saves_.due(step_)) save(opt_.save, true);
    for (int epoch = start_epoch_; epoch < opt_.epochs && !out_of_steps(); ++epoch)
      if (!train_epoch(epoch)) break;
    if (window_->is_open()) close_window();  // the run ended inside the window
    if (stop_requested()) {
      const std::string path = stop_save_path();
      save(path, false);
      std::printf("stopped by a signal after step %ld: checkpoint saved to %s (continue with --resume %s)\n", step_,
                  path.c_str(), path.c_str());
      report_.summary(summary());
      return 0;
    }
    if (opt_.eval && evaluated_at_ != step_) evaluate();  // stopped by --steps inside an epoch
    if (!opt_.save.empty()) {
      save(opt_.save, false);
      std::printf("checkpoint saved to %s\n", opt_.save.c_str());
    }
  } catch (const Diverged& d) {
    std::fflush(stdout);
    const std::string line = failed(std::string(d.what()) + saves_.after_divergence(first_step_));
    std::fprintf(stderr, "error: %s\n", line.c_str());
    return 1;
  } catch (const OutputFailed& e) {
    const std::string path = stop_save_path();
    save(path, false);  // a save that fails too is rescued, and says so
    throw Fatal(std::string(e.what()) + "; the state of step " + std::to_string(step_) + " was saved to " + path +
                " (continue with --resume " + path + ")");
  } catch (const ImageDecodeError& e) {
    // An image that passed the header check did not decode: keep what was trained, name the file.
    // On several ranks a save is collective and the others are elsewhere: they are told, nothing is saved.
    std::string line = e.what();
    if (dp_) {
      line = failed(line + "; not saved (the other ranks stop too): fix or remove the file, then resume from the "
                           "last --save-every checkpoint");
    } else {
      const std::string path = stop_save_path();
      save(path, false);
      line += "; the state after step " + std::to_string(step_) + " is saved to " + path +
              " (fix or remove the file, then --resume " + path + ")";
    }
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", line.c_str());
    return 1;
  }
  report_.summary(summary());
  return 0;
}

// Returns false when the run should stop (signal).
bool Trainer::train_epoch(int epoch) {
  epoch_now_ = epoch;
  const Dataset& train = data_.split.train;
  const EpochPlan plan = my_part(train_plan(train, global_batch(), opt_.seed, epoch));
  const int first = epoch == start_epoch_ ? start_k_ : 0;
  loader_->begin_pass(train, plan, first);
  // last_ is current: the previous epoch ended with read_counters_now().
  counters_->set_train(fresh_totals(last_.train.last_good_loss));
  if (!opt_.sample_png.empty() && epoch == start_epoch_ && writes()) write_sample_png(plan, first);

  Event start, end;
  const auto wall0 = std::chrono::steady_clock::now();
  start.record(ctx_->stream);
  report_.begin_progress(step_);
  const long epoch_first_step = step_;
  int k = first;
  for (; k < plan.steps && !out_of_steps() && !stop_requested(); ++k) {
    k_now_ = k;
    train_step(k);
    if (saves_.due(step_)) save(opt_.save, true);
  }
  end.record(ctx_->stream);
  if (dp_) dp_->sum_totals(&counters_->device()->train);  // the epoch's loss and accuracy over every rank
  read_counters_now();
  EpochResult r;
  r.train_ms = end.ms_since(start);
  r.stall_ms = timing_->stall_ms(epoch_first_step, step_ - 1, true);
  timing_->drop_before(window_->done() ? step_ : std::min(step_, window_->first()));
  if (!opt_.loss_log.empty() && writes()) write_loss_log(epoch_first_step, step_ - epoch_first_step);
  report_.progress(epoch_now_, k_now_, steps_per_epoch_, step_, mean_loss(last_.train), true);
  final_train_loss_ = mean_loss(last_.train);
  final_train_acc_ = accuracy(last_.train);
  if (stop_requested()) return false;
  if (k < plan.steps) return true;  // --steps ended the run inside this epoch
  if (opt_.eval) evaluate();
  r.epoch = epoch;
  r.step = step_;
  r.images = static_cast<long>(last_.train.count / opt_.batch) * opt_.batch;
  r.train_loss = final_train_loss_;
  r.train_acc = final_train_acc_;
  r.test_loss = final_test_loss_;
  r.test_acc = final_test_acc_;
  r.seconds = seconds_since(wall0);
  r.lr = schedule_.at(step_ - 1);
  r.loss_scale = last_.scaler.scale;
  r.skipped_steps = last_.scaler.skipped_steps;
  report_.epoch(r);
  return true;
}

void Trainer::write_sample_png(const EpochPlan& plan, int first) const {
  const Dataset& train = data_.split.train;
  std::vector<uint8_t> u8(train.image_bytes() * opt_.batch);
  std::vector<int32_t> labels(opt_.batch);
  assemble_batch_u8(train, plan, first, build_.layout, u8.data(), labels.data());
  write_sample_grid(opt_.sample_png, u8.data(), std::min(opt_.batch, 64), train.channels, train.side, build_.layout);
  std::printf("wrote the first augmented batch to %s\n", opt_.sample_png.c_str());
}

void Trainer::train_step(int k) {
  const long s = step_;
  if (window_->opens_at(s)) open_window();
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
      step_params_->upload(make_step_params(s, k, schedule_));  // learning rate, step index, loss slot
    }
    timing_->data_ready();
    // forward (+ loss), backward, optimizer step: enqueued now, or replayed as one CUDA graph
    step_graph_->run(s, {opt_.batch, batch.images, batch.labels},
                     [&] { enqueue_train_step(*net_, batch, step_targets(), sgd_settings(), ctx_->stream); });
    if (dp_) dp_->check_step();  // its gradients were averaged in backward (dist/data_parallel.h)
    ++step_;
    if (dp_) dp_->progress(step_);
    {
      NvtxRange r("loss stats", phase_color::kCyan);
      loss_stats();
    }
  }
  if (window_->closes_at(s)) close_window();
}

void Trainer::open_window() {
  window_->open();
  if (dp_) dp_->measure_exposure(true);
}

void Trainer::close_window() {
  window_->close(step_, *timing_);
  if (!dp_) return;
  dp_->measure_exposure(false);
  allreduce_exposed_ms_ = dp_->exposed_ms_per_step();
}

StepTargets Trainer::step_targets() const {
  DeviceCounters* c = counters_->device();
  return {&c->train, &c->scaler, step_params_->device(), loss_history_.as<float>()};
}

SgdSettings Trainer::sgd_settings() const {
  return {static_cast<float>(opt_.momentum), static_cast<float>(opt_.weight_decay), opt_.nesterov,
          build_.precision == DType::F16, opt_.loss_scale_window};
}

// Baseline: a synchronising copy every step (the seed's `loss.item()`). On-device accumulation: the
// counters stay on the GPU and are read asynchronously every --progress-every steps.
void Trainer::loss_stats() {
  const bool progress_due = step_ % opt_.progress_every == 0;
  if (!build_.device_loss) {
    take(counters_->read_blocking(step_));
  } else {
    if (!progress_due) return;
    const std::optional<CounterRead> landed = counters_->poll(step_);
    if (!landed) return;
    take(*landed);
  }
  if (progress_due) report_.progress(epoch_now_, k_now_, steps_per_epoch_, step_, mean_loss(last_.train), false);
}

// Every read of the counters goes through here: it stops a diverged run, and it is what proves a
// pending periodic save good.
void Trainer::take(const CounterRead& r) {
  last_ = r.counters;
  divergence_.check(r);
  saves_.on_read(r.steps, r.counters.scaler.skipped_steps, r.counters.scaler.diverged != 0);
}

void Trainer::read_counters_now() {
  const CounterRead r = counters_->read_now(step_);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  peak_mem_mb_ = std::max(peak_mem_mb_, double(free_before_ - std::min(free_before_, free_b)) / (1 << 20));
  take(r);
}

// On several ranks each evaluates its part of the test set (padding counts nowhere) with the BN
// running statistics averaged over the ranks, and the counts are summed.
void Trainer::evaluate() {
  NvtxRange range("evaluation", phase_color::kGrey);
  const Dataset& test = data_.split.test;
  const EpochPlan plan = my_part(eval_plan(test, global_batch()));
  loader_->begin_pass(test, plan, 0);
  average_running_stats();
  CUDA_CHECK(cudaMemsetAsync(&counters_->device()->eval, 0, sizeof(LossTotals), ctx_->stream));
  for (int k = 0; k < plan.steps; ++k) {
    loader_->get(k);
    const DeviceBatch b = loader_->copy(k);
    net_->forward(b.images, false);
    net_->loss(b.labels, &counters_->device()->eval, nullptr, nullptr);
    if (dp_) dp_->progress(step_);
  }
  if (dp_) dp_->sum_totals(&counters_->device()->eval);
  step_graph_->after_evaluation();
  read_counters_now();
  final_test_loss_ = mean_loss(last_.eval);
  final_test_acc_ = accuracy(last_.eval);
  evaluated_at_ = step_;
}

// ---- checkpoints and the loss log ---------------------------------------------------------------
// On several ranks every rank comes here at the same step: the BN running statistics are averaged
// first, and once that all-reduce has finished every rank has finished the step; rank 0 writes.
void Trainer::save(const std::string& path, bool periodic) {
  NvtxRange range("save checkpoint", phase_color::kGrey);
  average_running_stats();
  const CounterRead now = counters_->read_now(step_);
  take(now);  // a diverged state is never saved; an older pending save may be proven
  CheckpointMeta m = meta_;
  m.step = step_;
  m.epoch = static_cast<int>(step_ / steps_per_epoch_);
  m.step_in_epoch = static_cast<int>(step_ % steps_per_epoch_);
  m.loss_scale = now.counters.scaler.scale;
  m.good_steps = now.counters.scaler.good_steps;
  m.skipped_steps = now.counters.scaler.skipped_steps;
  if (writes()) saves_.save(capture_checkpoint(*net_, m), path, periodic);
  if (dp_) dp_->progress(step_);
}

bool Trainer::stop_requested() {
  if (!stopping_) stopping_ = dp_ ? dp_->agree_to_stop(step_, g_stop_requested) : g_stop_requested.load();
  return stopping_;
}

void Trainer::write_loss_log(long first_step, long count) const {
  std::vector<float> losses(count);
  const int k0 = static_cast<int>(first_step % steps_per_epoch_);
  CUDA_CHECK(cudaMemcpy(losses.data(), loss_history_.as<float>() + k0, count * sizeof(float), cudaMemcpyDeviceToHost));
  std::ofstream out(opt_.loss_log, first_step == first_step_ ? std::ios::trunc : std::ios::app);
  if (!out) throw OutputFailed(opt_.loss_log + ": cannot write the loss log");
  char line[64];
  for (long i = 0; i < count; ++i) {
    std::snprintf(line, sizeof(line), "%ld %.9g\n", first_step + i, losses[i]);  // %.9g: exact for floats
    out << line;
  }
  if (!out.flush()) throw OutputFailed(opt_.loss_log + ": writing the loss log failed (disk full?)");
}

RunSummary Trainer::summary() const {
  RunSummary s;
  s.gpu = prop_.name;
  s.data = data_.split.train.name;
  s.steps = step_ - first_step_;
  s.timed_steps = window_->timed_steps();
  s.window_ms = window_->ms();
  s.window_stall_ms = window_->stall_ms();
  s.gpu_busy_pct = window_->gpu_busy_pct();
  s.peak_gpu_mem_mb = peak_mem_mb_;
  s.final_train_loss = final_train_loss_;
  s.final_train_acc = final_train_acc_;
  s.final_test_loss = final_test_loss_;
  s.final_test_acc = final_test_acc_;
  s.params = static_cast<unsigned long>(net_->params().total());
  s.autotune_s = net_->algo_report().search_s;
  s.skipped_steps = last_.scaler.skipped_steps;
  s.allreduce_exposed_ms = allreduce_exposed_ms_;
  return s;
}

}  // namespace

int train_main(const BuildSettings& build, const Options& opt) {
  Trainer t(build, opt);
  try {
    return t.run();
  } catch (const UsageError& e) {  // found once the build is known (--autotune-cache): still exit 2
    throw UsageError(t.failed(e.what()));
  } catch (const std::exception& e) {
    throw Fatal(t.failed(e.what()));
  }
}
