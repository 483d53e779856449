// The set-up of a training run (setup.h), part by part in the order they are made.
#include "train/setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/gpu_warm_up.h"
#include "core/late_notice.h"
#include "core/phase_clock.h"
#include "dist/comm_stats.h"
#include "dist/grad_compression.h"
#include "kernels/loss.h"
#include "model/fused_conv.h"
#include "model/fused_patterns.h"
#include "model/resnet50_spec.h"
#include "train/checkpointing.h"
#include "train/decode_progress.h"
#include "train/data_parallel_setup.h"

namespace {

class SetUp {
 public:
  SetUp(TrainingSession& s, const BuildSettings& b, const Options& o, const Ranks& r, int workers)
      : s_(s), build_(b), opt_(o), ranks_(r), workers_(workers), gpu_warm_up_(r.launch().local_rank) {}

  void run() {
    phases_.begin("data");
    check_output_paths();
    read_data();
    check_resume();
    choose_learning_rate();
    normalise();
    if (ranks_.several()) {
      phases_.begin("ranks");  // the rendezvous, the rest of making the CUDA context, and NCCL's set-up
      gpu_warm_up_.wait();
      join_ranks();
    }
    set_up_gpu();
    phases_.begin("start state");
    start_point();
    phases_.end();
    std::printf("model: ResNet-50 (CIFAR stem), %s parameters; batch %d%s, %d steps per epoch\n",
                with_commas(static_cast<long long>(s_.params)).c_str(), step_images(),
                opt_.accumulate > 1 ? (" (" + std::to_string(opt_.accumulate) + " micro-batches of " +
                                       std::to_string(ranks_.global_batch(opt_.batch)) + ")").c_str()
                                    : "",
                s_.steps_per_epoch);
    if (lr_line_shown(s_.lr, step_batches())) std::printf("%s\n", lr_line(s_.lr).c_str());
    // Before the first step, whose warm-up and graph capture the first_step line's time holds.
    const double age = seconds_since_process_start();
    if (age < 0)
      std::printf("start-up: %s\n", phases_.line().c_str());
    else
      std::printf("start-up: %s; %.2f s since the process began\n", phases_.line().c_str(), age);
  }

 private:
  void check_output_paths();
  void check_cache_path();
  void read_data();
  void normalise();
  void decoding_begins(const char* what, long images);
  void print_data_lines() const;
  void check_resume();
  void choose_learning_rate();
  void join_ranks();
  NetConfig net_config() const;
  void set_up_gpu();
  void build_network();
  void print_conv_line(const AlgoReport& ar, bool measured, double build_s) const;
  void start_point();
  bool resume_average(const Checkpoint& c);
  void make_step_graphs();
  // Images per optimizer step: --batch x ranks x --accumulate.
  int step_images() const { return ranks_.global_batch(opt_.batch) * opt_.accumulate; }
  // Batches a step is made of: one per rank and micro-batch (the learning-rate rule's `parts`).
  int step_batches() const { return ranks_.launch().world * opt_.accumulate; }

  TrainingSession& s_;
  const BuildSettings& build_;
  const Options& opt_;
  const Ranks& ranks_;
  int workers_;
  std::unique_ptr<Checkpoint> resume_;  // --resume, checked; its state goes into the network at the start
  ZeroedRange kept_zero_{};             // the network's statistics_kept_zero(), for the step graph
  std::vector<ZeroedRange> zeroed_at_start_;  // its zeroed_at_step_start(), for the step graph
  bool cache_saved_ = true;             // the autotune cache's file can be written, and no CUDA tool skews it
  std::unique_ptr<DecodeProgress> decoding_;  // while images are decoded at start
  PhaseClock phases_;                         // what each part of the start took, for its last line
  GpuWarmUp gpu_warm_up_;                     // the CUDA context, made while the data is read
};

// Every file the run will write is checked before the data is loaded and the GPU is touched: a path
// found bad only when it is written would cost the run (the end-of-run save, the first loss log).
void SetUp::check_output_paths() {
  const bool cache_written = build_.algo == AlgoPolicy::Autotune && !opt_.deterministic;
  if (cache_written) check_files_distinct(opt_, true);  // parse_options checked the files but the cache
  for (const auto& [flag, path] : output_files(opt_, false))
    if (!path.empty()) check_output_path(path, flag);
  if (cache_written) check_cache_path();
}

// The autotune cache only saves a later start its search: where its default place cannot be written
// (a read-only checkout or working directory), the run measures without saving. A file the user
// named must be writable.
void SetUp::check_cache_path() {
  try {
    check_output_path(opt_.autotune_cache, "--autotune-cache");
  } catch (const InputError& e) {
    if (opt_.autotune_cache != default_autotune_cache()) throw;
    ranks_.warn_once_per_machine(std::string(e.what()) + "; training without saving the measured algorithms "
                                 "(--autotune-cache FILE saves them where they can be)");
    cache_saved_ = false;
  }
}

// The data set, read and checked (an image folder's files by their headers); --cache-decoded then
// decodes the folder into memory.
void SetUp::read_data() {
  ImageOptions images;
  images.side = opt_.image_size;
  images.skip_bad = opt_.skip_bad_images;
  images.cache_decoded = opt_.cache_decoded;
  images.threads = workers_;
  images.before_decoding = [this](int n) { decoding_begins("data: decoding into memory", n); };
  s_.data = load_data_set(opt_.data, opt_.data_dir, opt_.synthetic_size, step_images(), opt_.seed, images);
  decoding_.reset();
  const Dataset& train = s_.data.split.train;
  if (train.classes() > kSoftmaxMaxClasses)
    throw InputError(s_.data.dir + ": " + std::to_string(train.classes()) + " classes; the loss kernel takes at most " +
                     std::to_string(kSoftmaxMaxClasses));
  s_.steps_per_epoch = train.count / step_images();
  for (const std::string& w : s_.data.warnings) ranks_.warn_once(w);
}

// The input normalisation's statistics (of a sample decoded now, for images decoded every epoch),
// then the data lines that report them.
void SetUp::normalise() {
  const Dataset& train = s_.data.split.train;
  if (train.decoded_on_demand)
    decoding_begins("normalisation: decoding a sample", std::min(train.count, kNormalizationSample));
  s_.norm = compute_normalization(train, workers_);
  decoding_.reset();
  if (!s_.norm.warning.empty()) ranks_.warn_once(s_.norm.warning);
  print_data_lines();
}

// Decoding a large folder takes minutes: the GPU is looked for first, so that a machine without one
// learns it at once, and the work says how far it is once it runs long.
void SetUp::decoding_begins(const char* what, long images) {
  require_cuda_device();
  const long before = images_decoded();
  decoding_ = std::make_unique<DecodeProgress>(what, images, [before] { return images_decoded() - before; });
}

void SetUp::print_data_lines() const {
  const Dataset& train = s_.data.split.train;
  const Normalization& n = s_.norm;
  const char* channels = train.channels == 1 ? "grey (replicated to 3 channels)" : "3 channels";
  if (train.name != "folder") {
    std::printf("data: %s from %s: %d train, %d test images, %dx%d, %s, mean %.4f std %.4f\n", train.name.c_str(),
                s_.data.dir.c_str(), train.count, s_.data.split.test.count, train.side, train.side, channels, n.mean[0],
                n.stdev[0]);
    return;
  }
  std::printf("data: folder %s: %s train, %s test images, %d classes, %dx%d, %s, %s\n", s_.data.dir.c_str(),
              with_commas(train.count).c_str(), with_commas(s_.data.split.test.count).c_str(), train.classes(),
              train.side, train.side, channels,
              train.decoded_on_demand ? (build_.loader == LoaderKind::PinnedRing ? "decoded every epoch by the loader threads"
                                                                                 : "decoded every epoch on the main thread")
                                      : "decoded once into memory");
  for (const std::string& note : s_.data.notes) std::printf("%s\n", note.c_str());
  std::printf("normalisation: mean %.4f %.4f %.4f, std %.4f %.4f %.4f, from %s\n", n.mean[0], n.mean[1], n.mean[2],
              n.stdev[0], n.stdev[1], n.stdev[2],
              n.images < train.count ? ("a sample of " + with_commas(n.images) + " of the " + with_commas(train.count) +
                                        " training images").c_str()
                                     : ("all " + with_commas(train.count) + " training images").c_str());
}

// The checkpoint to resume from must fit this build, model, batch, data set and training set size:
// all of it is known without the GPU (the model from its CPU listing).
void SetUp::check_resume() {
  s_.meta = run_meta(build_, resnet50_params(net_config()), s_.data.split.train, opt_);
  s_.meta.batch = step_images();  // what a resume on another number of GPUs must keep
  if (opt_.resume.empty()) return;
  resume_ = std::make_unique<Checkpoint>(load_checkpoint(opt_.resume));
  check_checkpoint_fits(resume_->meta, s_.meta, opt_.resume);
  check_checkpoint_position(resume_->meta, s_.steps_per_epoch, opt_.resume);
}

// The rates and warm-up follow the images of a step, over all GPUs and micro-batches, wherever a step
// is made of several batches (train/lr_scaling.h); a resume keeps the rule its checkpoint was trained
// under, which the checkpoints of this run record in turn.
void SetUp::choose_learning_rate() {
  const ResumedLrRule resumed = resume_ ? ResumedLrRule{resume_->meta.lr_scaled, resume_->meta.lr_reference_batch}
                                        : ResumedLrRule{};
  s_.lr = choose_lr({opt_.lr, opt_.min_lr, opt_.warmup_epochs}, step_images(), step_batches(),
                    opt_.lr_scaling, opt_.warmup_cap, resume_ ? &resumed : nullptr);
  CheckpointMeta& m = s_.meta;
  m.lr_recorded = true;
  m.lr_scaled = s_.lr.scaled();
  m.lr_reference_batch = s_.lr.reference_batch;
  m.lr = s_.lr.used.peak;
  m.min_lr = s_.lr.used.min;
  m.warmup_epochs = s_.lr.used.warmup_epochs;
}

// Several ranks: meet the others (the run is refused if any was started differently), take this
// rank's GPU and join the NCCL communicator, before anything else is put on the GPU.
void SetUp::join_ranks() {
  const LaunchInfo& launch = ranks_.launch();
  if (resume_) check_global_batch(resume_->meta, opt_.batch, launch.world, opt_.accumulate, opt_.resume);
  if (opt_.grad_compression == "int8") check_int8_world(launch.world);  // before any rank waits for 127 others
  const Fingerprint f = run_fingerprint(build_, opt_, launch.world, s_.data.split, s_.norm, resume_.get());
  s_.dp = std::make_unique<DataParallel>(launch, f, data_parallel_config(build_, opt_));
}

NetConfig SetUp::net_config() const {
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
  cfg.unfused_patterns =
      opt_.no_fuse_given ? opt_.no_fuse_patterns : default_unfused_patterns(build_.wgrad_stream);
  cfg.unfused_by_default = !opt_.no_fuse_given;
  cfg.wgrad_beside = build_.wgrad_stream;
  cfg.data_parallel = ranks_.several();
  cfg.classes = s_.data.split.train.classes();
  cfg.image_side = s_.data.split.train.side;
  return cfg;
}

void SetUp::set_up_gpu() {
  phases_.begin("GPU");
  gpu_warm_up_.wait();
  require_cuda_device();
  int device = 0;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  s_.gpu_name = prop.name;
  s_.ctx = std::make_unique<GpuContext>();
  size_t total = 0;
  CUDA_CHECK(cudaMemGetInfo(&s_.free_before, &total));
  std::printf("gpu: %s (sm_%d%d, %d SMs, %s), cuDNN %zu\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, format_bytes(total).c_str(), cudnnGetVersion());
  phases_.begin("network");
  build_network();
  phases_.begin("loader and step graphs");
  if (s_.dp) {
    std::printf("data parallel: %s; --batch %d per GPU, %d per step\n", s_.dp->describe().c_str(), opt_.batch,
                step_images());
    const EnvLookup env = [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
    std::printf("nccl: %s\n", nccl_settings_text(nccl_settings(env)).c_str());
  } else if (opt_.grad_compression != "none") {
    ranks_.warn_once("--grad-compression " + opt_.grad_compression + " compresses what the ranks exchange; a run on "
                     "one GPU exchanges nothing");
  }
  const Dataset& train = s_.data.split.train;
  LoaderConfig lc{build_.loader, opt_.batch, workers_, build_.precision, build_.layout, s_.norm,
                  train.channels, train.side, s_.ctx->stream};
  s_.loader = make_loader(lc);
  s_.step_params = std::make_unique<StepParamsOnDevice>(s_.ctx->stream);
  make_step_graphs();
  s_.timing = std::make_unique<StepTiming>(s_.ctx->stream);
  s_.counters = std::make_unique<CounterReader>(s_.ctx->stream);
  // int8 compression keeps its residuals unscaled: it reads the loss scale the step's gradients carry.
  if (s_.dp) s_.dp->set_loss_scale(&s_.counters->device()->scaler.scale);
}

// The step's graph; with --accumulate, one per kind of micro-batch (the step's graph is its last),
// each captured after its own warm-up and replayed (every graph is bound to the same batch buffers).
void SetUp::make_step_graphs() {
  s_.step_graph = std::make_unique<StepGraph>(*s_.ctx, opt_.batch, build_.cuda_graph, opt_.cuda_graph);
  const int kinds = opt_.accumulate > 2 ? 2 : opt_.accumulate - 1;
  for (int k = 0; k < kinds; ++k)
    s_.micro_graphs[k] = std::make_unique<StepGraph>(*s_.ctx, opt_.batch, build_.cuda_graph, opt_.cuda_graph);
  for (auto* g : {&s_.step_graph, &s_.micro_graphs[0], &s_.micro_graphs[1]})
    if (*g) {
      (*g)->drop_memsets_into(kept_zero_);
      (*g)->hoist_memsets_from(zeroed_at_start_);
    }
  if (build_.cuda_graph)
    std::printf("step: %s%s\n", s_.step_graph->describe().c_str(),
                kinds ? (", one graph for each kind of micro-batch (--accumulate " + std::to_string(opt_.accumulate) +
                         ": the first, " + (kinds == 2 ? "the middle ones, " : "") + "the last)").c_str()
                      : "");
}

// The network, with its conv algorithms chosen, and what the rest of the run needs of it: every call
// the set-up makes on the network but its starting state (start_point) is here. --deterministic
// takes the algorithms from the heuristics (filtered to deterministic ones): measured choices could
// differ between runs, and so would the rounding.
void SetUp::build_network() {
  const NetConfig cfg = net_config();
  const bool measure = cfg.conv.policy == AlgoPolicy::Autotune;
  const AutotuneContext context{s_.gpu_name, cudnnGetVersion(), cfg.dtype, cfg.layout, cfg.tf32, cfg.conv_api,
                                opt_.workspace_mb};
  s_.cache = std::make_unique<AutotuneCache>(measure ? opt_.autotune_cache : "", context);
  for (const std::string& w : s_.cache->load()) ranks_.warn_once_per_machine(w);

  const bool under_tool = s_.cache->leave_unsaved_under_tool();
  if (under_tool) cache_saved_ = false;
  const auto start = std::chrono::steady_clock::now();
  if (measure) s_.cache->arm_late_notice(kLateNoticeDelay);
  s_.net = std::make_unique<TrainingNetwork>(cfg, *s_.ctx, *s_.cache);
  s_.cache->end_late_notice();
  print_conv_line(s_.net->algo_report(), measure, seconds_since(start));
  if (cfg.fused_bn)
    for (const std::string& line : fusion_report_lines(s_.net->fusion_report())) std::printf("%s\n", line.c_str());
  else if (opt_.no_fuse_given && opt_.no_fuse_patterns)
    ranks_.warn_once(kNoFuseWithoutFusion);
  if (measure && cache_saved_ && ranks_.writes() && s_.cache->changed()) s_.cache->save();  // new choices or plans
  else if (measure && s_.cache->changed() && under_tool)
    ranks_.warn_once_per_machine(s_.cache->unsaved_line());
  s_.params = static_cast<unsigned long>(s_.net->params().total());
  s_.autotune_s = s_.net->algo_report().search_s;
  kept_zero_ = s_.net->statistics_kept_zero();
  zeroed_at_start_ = s_.net->zeroed_at_step_start();
  if (opt_.ema > 0) s_.average = std::make_unique<WeightAverage>(s_.net->params(), opt_.ema);
  if (opt_.tta_flip) s_.flip = std::make_unique<FlipEvaluation>(cfg);
  if (opt_.accumulate > 1) s_.sums = std::make_unique<GradAccumulation>(s_.net->params(), opt_.accumulate);
  if (s_.dp) {
    s_.dp->attach(s_.net->params(), s_.ctx->stream, s_.sums.get());
    s_.net->on_grad_ready = [dp = s_.dp.get()](int param) { dp->on_grad_ready(param); };
  }
}

void SetUp::print_conv_line(const AlgoReport& ar, bool measured, double build_s) const {
  const char* api = conv_api_name(build_.conv_api);
  std::string ws = format_bytes(ar.workspace);
  if (ar.lane_workspace) ws += " + " + format_bytes(ar.lane_workspace) + " for the weight gradients' stream";
  if (ar.fused_workspace) ws += " + " + format_bytes(ar.fused_workspace) + " for the fused patterns, each its own";
  if (!measured)
    std::printf("convs: %d shapes, algorithms from cuDNN's heuristics%s, %s API, workspace %s\n", ar.shapes,
                opt_.deterministic ? " (deterministic only)" : "", api, ws.c_str());
  else if (ar.searched == 0)
    std::printf("convs: all %d shapes from the autotune cache %s (no search; network built in %.1f s), %s API, "
                "workspace %s\n", ar.shapes, opt_.autotune_cache.c_str(), build_s, api, ws.c_str());
  else
    std::printf("convs: autotuned %d of %d shapes in %.2f s (%s %s), %s API, workspace %s\n", ar.searched, ar.shapes,
                ar.search_s, cache_saved_ ? "saved to" : "not saved to", opt_.autotune_cache.c_str(), api, ws.c_str());
}

// The weights from the checkpoint, or fresh ones; on several ranks every rank then holds rank 0's.
void SetUp::start_point() {
  StartPoint& p = s_.start;
  p.counters = initial_counters(build_.precision == DType::F16 ? static_cast<float>(opt_.loss_scale) : 1.f);
  bool resumed_average = false;  // every rank reads the same checkpoint: the averages agree
  if (resume_) {
    const Checkpoint& c = *resume_;
    restore_checkpoint(*s_.net, c, s_.ctx->stream);
    resumed_average = resume_average(c);
    p.step = c.meta.step;
    p.epoch = c.meta.epoch;
    p.step_in_epoch = c.meta.step_in_epoch;
    p.counters.scaler.scale = c.meta.loss_scale;
    p.counters.scaler.good_steps = c.meta.good_steps;
    p.counters.scaler.skipped_steps = c.meta.skipped_steps;
    if (c.meta.seed != opt_.seed || c.meta.epochs != opt_.epochs)
      ranks_.warn_once("the checkpoint was made with --seed " + std::to_string(c.meta.seed) + " --epochs " +
                       std::to_string(c.meta.epochs) + "; continuing with --seed " + std::to_string(opt_.seed) +
                       " --epochs " + std::to_string(opt_.epochs) + " changes the data order or learning rate");
    if (c.meta.lr_recorded) {
      const std::string lr = lr_resume_difference({c.meta.lr, c.meta.min_lr, c.meta.warmup_epochs}, s_.lr.used);
      if (!lr.empty()) ranks_.warn_once(lr);
    }
    std::printf("resumed from %s at step %ld (epoch %d, step %d of it)\n", opt_.resume.c_str(), p.step, p.epoch + 1,
                p.step_in_epoch);
    resume_.reset();
  } else {
    s_.net->init_params(opt_.seed, opt_.zero_init_residual);
  }
  if (s_.dp) share_start_state(*s_.dp, *s_.net, s_.ctx->stream);  // every rank starts from rank 0's state, bit for bit
  if (s_.average && !resumed_average) s_.average->start_from(s_.net->params(), s_.ctx->stream);
  s_.counters->set(p.counters);
}

// The weight average (--ema) goes on from the checkpoint's, where it holds one; returns whether it
// did. Any other combination is a warning saying what happens to the average.
bool SetUp::resume_average(const Checkpoint& c) {
  if (!s_.average) {
    if (!c.ema.empty())
      ranks_.warn_once("the checkpoint holds a weight average (--ema " + show_number(c.meta.ema_decay) +
                       "), which this run without --ema neither evaluates nor saves");
    return false;
  }
  if (c.ema.empty()) {
    ranks_.warn_once("the checkpoint holds no weight average: the one of --ema starts from its weights");
    return false;
  }
  if (c.meta.ema_decay != opt_.ema)
    ranks_.warn_once("the checkpoint's weight average has decay " + show_number(c.meta.ema_decay) +
                     "; continuing it with --ema " + show_number(opt_.ema));
  s_.average->load(c.ema, s_.ctx->stream);
  return true;
}

}  // namespace

void set_up_training(TrainingSession& s, const BuildSettings& build, const Options& opt, const Ranks& ranks,
                     int workers) {
  SetUp(s, build, opt, ranks, workers).run();
}
