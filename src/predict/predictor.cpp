// bin/predict's program: inputs checked, the model exported or loaded in inference mode, the batch
// loop, the processing and in-order writing of its outputs, the report.
#include "predict/predictor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include <cudnn.h>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/handles.h"
#include "core/json_line.h"
#include "core/late_notice.h"
#include "data/augment.h"
#include "data/data_choice.h"
#include "export/confusion_png.h"
#include "export/npy.h"
#include "measure/profiling.h"
#include "measure/step_timing.h"
#include "model/autotune_cache.h"
#include "model/inference_network.h"
#include "pipeline/egress_copy.h"
#include "pipeline/loader.h"
#include "predict/outputs.h"
#include "predict/weights.h"
#include "train/checkpointing.h"
#include "train/options.h"  // default_workers, and the trainer's cuDNN defaults (workspace, cache file, TF32)
#include "train/window.h"

namespace {

// The side of the data set's images, which the network's input is. (One place to change when image
// sizes become a property of the data set.)
int image_side(const Dataset& d) { return d.side; }

std::string json_numbers(const float* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.9g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

class Predictor {
 public:
  Predictor(const BuildSettings& b, const EgressSettings& e, const PredictOptions& o)
      : build_(b), egress_(e), opt_(o), workers_(o.workers > 0 ? o.workers : default_workers()) {}
  int run();

 private:
  void check_output_paths() const;
  void load_inputs();
  void export_model() const;
  void setup_gpu();
  void build_network();
  void open_outputs();
  EgressPipeline::Commit process(int k, const void* host);
  void run_batches();
  void finish_outputs();
  void report() const;
  const Dataset& images() const { return opt_.split == "test" ? data_.split.test : data_.split.train; }
  int classes() const { return static_cast<int>(class_names_.size()); }
  // As bin/train chooses: --deterministic takes cuDNN's heuristics; otherwise the build's policy,
  // which for autotuning builds reads and writes the autotune cache.
  AlgoPolicy conv_policy() const { return opt_.deterministic ? AlgoPolicy::Heuristic : build_.algo; }
  bool writes_autotune_cache() const { return conv_policy() == AlgoPolicy::Autotune; }

  const BuildSettings& build_;
  const EgressSettings& egress_;
  PredictOptions opt_;
  int workers_;
  // inputs
  std::unique_ptr<Checkpoint> ckpt_;
  ChosenData data_;
  Normalization norm_{};
  std::vector<std::string> class_names_;
  TensorLayout tensors_;
  Layout stored_layout_ = Layout::NCHW;
  EpochPlan plan_;
  // GPU
  std::unique_ptr<GpuContext> ctx_;
  cudaDeviceProp prop_{};
  std::unique_ptr<InferenceNetwork> net_;
  std::unique_ptr<BatchLoader> loader_;
  // outputs, written by the pipeline's commits in batch order
  OutputFormat format_;
  std::unique_ptr<AtomicFile> csv_;
  std::unique_ptr<NpyWriter> npy_;
  std::vector<long> confusion_;
  // the timed window
  int timed_batches_ = 0;
  long timed_images_ = 0;
  double seconds_ = 0, stall_ms_ = 0, egress_wait_s_ = 0;
};

int Predictor::run() {
  name_this_thread("main");
  std::printf("%s\nnetwork: %s\n", egress_.describe().c_str(), network_description(build_).c_str());
  // Everything the user gave is checked before any work and before the GPU is touched.
  check_output_paths();
  load_inputs();
  if (!opt_.export_path.empty()) {
    export_model();
    return 0;
  }
  setup_gpu();
  open_outputs();
  run_batches();
  finish_outputs();
  report();
  return 0;
}

// ---- inputs -------------------------------------------------------------------------------------
void Predictor::check_output_paths() const {
  const bool cache_written = opt_.export_path.empty() && writes_autotune_cache();
  if (cache_written) check_predict_files_distinct(opt_, true);  // parsing checked the files but the cache
  for (const auto& [flag, path] : predict_output_files(opt_, cache_written))
    if (!path.empty()) check_output_path(path, flag);
}

void Predictor::load_inputs() {
  ckpt_ = std::make_unique<Checkpoint>(load_checkpoint(opt_.checkpoint));
  const CheckpointMeta& m = ckpt_->meta;
  // Synthetic images come from the checkpoint's seed: the images its run was evaluated on; every data
  // set is served at the image side the checkpoint was trained at.
  ImageOptions served;
  served.side = m.image_side;
  served.skip_bad = opt_.skip_bad_images;
  served.cache_decoded = opt_.cache_decoded;
  served.threads = default_workers();
  data_ = load_data_set(opt_.data, opt_.data_dir, opt_.synthetic_size, opt_.batch, m.seed, served);
  const Dataset& train = data_.split.train;
  if (train.name != m.data) {  // "--data folder chose folder" said nothing: what the flag gave, and where
    const auto named = [](const std::string& data) { return data == "folder" ? std::string("an image folder") : data; };
    throw InputError(opt_.checkpoint + ": trained on " + named(m.data) + ", but --data " + opt_.data + " gave " +
                     named(train.name) + " (" + data_.dir + "): pass --data " + m.data + " (and --data-dir where its " +
                     (m.data == "folder" ? "images are)" : "files are)"));
  }
  check_checkpoint_classes(m.class_names, train.class_names, data_.dir, opt_.checkpoint);
  norm_ = compute_normalization(train, default_workers());
  class_names_ = images().class_names;
  if (class_names_.empty())  // a data set without names: the class indices
    for (int c = 0; c < kArrayClasses; ++c) class_names_.push_back(std::to_string(c));
  tensors_ = Network::tensor_layout(classes());
  check_checkpoint_model(m, tensors_, opt_.checkpoint);
  stored_layout_ = checkpoint_layout(m, opt_.checkpoint);
  opt_.top_k = resolved_top_k(opt_, classes(), train.name);
  plan_ = eval_plan(images(), opt_.batch);
  std::printf("checkpoint: %s: step %lld of a %s/%s build, trained on %s\n", opt_.checkpoint.c_str(),
              static_cast<long long>(m.step), m.precision.c_str(), m.layout.c_str(), m.data.c_str());
  std::printf("data: %s split of %s from %s: %d images, %d classes\n", opt_.split.c_str(), train.name.c_str(),
              data_.dir.c_str(), images().count, classes());
}

void Predictor::export_model() const {
  const CheckpointMeta& m = ckpt_->meta;
  std::string names = "[";
  for (int c = 0; c < classes(); ++c) names += (c ? ", " : "") + JsonLine::quote(class_names_[c]);
  const SafeMetadata meta = {{"format", "pt"},
                             {"model", m.model},
                             {"classes", std::to_string(classes())},
                             {"class_names", names + "]"},
                             {"data", m.data},
                             {"input_side", std::to_string(image_side(images()))},
                             {"input_mean", json_numbers(norm_.mean, kModelChannels)},
                             {"input_std", json_numbers(norm_.stdev, kModelChannels)},
                             {"step", std::to_string(m.step)},
                             {"trained_build", m.precision + "/" + m.layout},
                             {"checkpoint", opt_.checkpoint}};
  const std::vector<SafeTensor> tensors = export_tensors(*ckpt_, tensors_);
  write_safetensors(opt_.export_path, tensors, meta);
  std::printf("exported %zu tensors (%s parameters, BN running statistics) to %s\n", tensors.size(),
              with_commas(static_cast<long long>(m.params)).c_str(), opt_.export_path.c_str());
  // bench/load_safetensors.py evaluates on the test sets it can read: CIFAR-10's and Fashion-MNIST's.
  if (m.data == "cifar10" || m.data == "fashion-mnist")
    std::printf("load it into PyTorch: python3 bench/load_safetensors.py %s --data-dir DIR\n", opt_.export_path.c_str());
  else
    std::printf("load it into PyTorch: bench/lib/pytorch_resnet.py's ResNet50Cifar(num_classes=%d) takes its tensors as a "
                "state_dict, named as bench/load_safetensors.py names them (which evaluates CIFAR-10 and "
                "Fashion-MNIST models only)\n", classes());
}

// ---- the GPU and the network ----------------------------------------------------------------------
void Predictor::setup_gpu() {
  require_cuda_device();
  CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
  ctx_ = std::make_unique<GpuContext>();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::printf("gpu: %s (sm_%d%d, %d SMs, %s), cuDNN %zu\n", prop_.name, prop_.major, prop_.minor,
              prop_.multiProcessorCount, format_bytes(total_b).c_str(), cudnnGetVersion());
  build_network();
  const LoaderConfig lc{build_.loader, opt_.batch, default_workers(), build_.precision, build_.layout, norm_,
                        images().channels, images().side, ctx_->stream};
  loader_ = make_loader(lc);
}

// The network in inference mode, its conv algorithms chosen as bin/train chooses them (same cache
// file and workspace), and the checkpoint's weights with its filters in this build's layout.
void Predictor::build_network() {
  const Options trainer_defaults;
  NetConfig cfg;
  cfg.batch = opt_.batch;
  cfg.dtype = build_.precision;
  cfg.layout = build_.layout;
  cfg.tf32 = trainer_defaults.tf32;
  cfg.conv.policy = conv_policy();
  cfg.conv.deterministic = opt_.deterministic;
  cfg.conv.workspace_limit = size_t(trainer_defaults.workspace_mb) << 20;
  cfg.conv_api = build_.conv_api;
  cfg.classes = classes();
  cfg.image_side = images().side;
  cfg.fused_bn = build_.fused_bn;  // each BN, the residual add and the ReLU in the conv before them
  cfg.unfused_patterns = opt_.no_fuse_patterns;
  const bool measure = writes_autotune_cache();
  AutotuneCache cache(measure ? trainer_defaults.autotune_cache : "",
                      AutotuneContext{prop_.name, cudnnGetVersion(), cfg.dtype, cfg.layout, cfg.tf32, cfg.conv_api,
                                      trainer_defaults.workspace_mb});
  for (const std::string& w : cache.load()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const bool under_tool = cache.leave_unsaved_under_tool();
  if (measure) cache.arm_late_notice(kLateNoticeDelay);
  net_ = std::make_unique<InferenceNetwork>(cfg, *ctx_, cache);
  cache.end_late_notice();
  if (measure && cache.changed() && !under_tool) cache.save();  // new conv choices or fused plans
  else if (measure && cache.changed())
    std::fprintf(stderr, "warning: %s\n", cache.unsaved_line().c_str());
  if (cfg.fused_bn)
    for (const std::string& line : fusion_report_lines(net_->fusion_report())) std::printf("%s\n", line.c_str());
  else if (cfg.unfused_patterns)
    std::fprintf(stderr, "warning: %s\n", kNoFuseWithoutFusion);

  Checkpoint weights;
  weights.master = convert_filters(ckpt_->master, tensors_, stored_layout_, build_.layout);
  weights.running = std::move(ckpt_->running);
  restore_checkpoint(*net_, weights, ctx_->stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  const ParamTensor& fc_bias = tensors_.params.back();
  format_.bias.assign(weights.master.begin() + fc_bias.offset, weights.master.begin() + fc_bias.offset + fc_bias.count);
  std::printf("model: ResNet-50 (CIFAR stem), %s parameters, inference mode; batch %d, %d batches%s\n",
              with_commas(static_cast<long long>(net_->params().total())).c_str(), opt_.batch, plan_.steps,
              stored_layout_ == build_.layout ? ""
                                               : (std::string("; filters converted from ") + layout_name(stored_layout_) +
                                                  " to " + layout_name(build_.layout)).c_str());
}

// ---- outputs --------------------------------------------------------------------------------------
void Predictor::open_outputs() {
  format_.batch = opt_.batch;
  format_.classes = classes();
  format_.top_k = opt_.top_k;
  format_.features = opt_.features.empty() ? 0 : net_->feature_count();
  format_.features_in = build_.precision;
  format_.features_out = opt_.features_dtype;
  format_.class_names = class_names_;
  csv_ = std::make_unique<AtomicFile>(opt_.out);
  csv_->write(csv_header(format_));
  if (format_.features)
    npy_ = std::make_unique<NpyWriter>(opt_.features, opt_.features_dtype,
                                       std::vector<size_t>{size_t(images().count), size_t(format_.features)});
  confusion_.assign(size_t(classes()) * classes(), 0);
}

// A worker's part of batch k (any order, any thread); the commit it returns runs in batch order.
EgressPipeline::Commit Predictor::process(int k, const void* host) {
  const int rows = k == plan_.steps - 1 ? plan_.valid_last : opt_.batch;
  auto result = std::make_shared<BatchResult>(
      process_batch(format_, images(), plan_.order.data() + size_t(k) * opt_.batch, rows, host));
  return [this, result] {
    csv_->write(result->csv);
    if (npy_) npy_->append(result->features.data(), result->features.size());
    for (size_t i = 0; i < confusion_.size(); ++i) confusion_[i] += result->confusion[i];
  };
}

void Predictor::finish_outputs() {
  csv_->commit();
  if (npy_) npy_->commit();
  write_confusion_png(confusion_png_path(opt_.out), confusion_, class_names_);
}

// ---- the loop -------------------------------------------------------------------------------------
// The window (images/s, cudaProfilerStart/Stop, --trace) opens after --warmup-batches batches and
// closes once every output is written: the outputs are the product, so their processing is timed.
void Predictor::run_batches() {
  loader_->begin_pass(images(), plan_, 0);
  std::vector<EgressRegion> regions = {{net_->logits(), format_.logits_bytes()}};
  if (format_.features) regions.push_back({net_->features(), format_.features_bytes()});
  const int workers = egress_.workers ? workers_ : 0;
  const int slots = workers + (egress_.workers ? 2 : 1);  // one being copied, one queued, one per worker
  CudaEgressEngine engine(egress_, slots, regions, ctx_->stream);
  EgressPipeline pipeline(slots, workers, engine, [this](int k, const void* host) { return process(k, host); });
  StepTiming timing(ctx_->stream);
  const int first_timed = std::min(opt_.warmup_batches, plan_.steps - 1);
  SteadyStateWindow window(ctx_->stream, first_timed, plan_.steps - first_timed, opt_.trace);
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < plan_.steps; ++k) {
    if (window.opens_at(k)) {
      window.open();
      pipeline.take_wait_seconds();
      t0 = std::chrono::steady_clock::now();
    }
    NvtxRange step("step " + std::to_string(k), phase_color::kGrey);
    timing.begin_step(k);
    DeviceBatch batch;
    {
      NvtxRange r("get batch", phase_color::kRed);
      loader_->get(k);
      batch = loader_->copy(k);
    }
    timing.data_ready();
    {
      NvtxRange r("compute", phase_color::kGreen);
      net_->forward(batch.images);
    }
    pipeline.submit(k);  // "copy to CPU", and without output workers "process output" too
  }
  pipeline.finish();
  seconds_ = seconds_since(t0);
  egress_wait_s_ = pipeline.take_wait_seconds();
  window.close(plan_.steps, timing);
  timed_batches_ = plan_.steps - first_timed;
  timed_images_ = long(images().count) - long(first_timed) * opt_.batch;
  stall_ms_ = window.stall_ms();
}

void Predictor::report() const {
  const double ips = seconds_ > 0 ? timed_images_ / seconds_ : 0;
  const double stall_pct = seconds_ > 0 ? 100.0 * stall_ms_ / (seconds_ * 1e3) : 0;
  std::printf("predicted %s images; timed %d batches after %d warm-up: %s images/s, %.3f ms a batch, data stall "
              "%.1f%%, main thread waited %.3f s for output buffers\n",
              with_commas(images().count).c_str(), timed_batches_, plan_.steps - timed_batches_,
              with_commas(std::lround(ips)).c_str(), timed_batches_ ? 1e3 * seconds_ / timed_batches_ : 0.0, stall_pct,
              egress_wait_s_);
  std::printf("%s", confusion_report(confusion_, class_names_).c_str());
  std::printf("wrote %s, %s%s\n", opt_.out.c_str(), confusion_png_path(opt_.out).c_str(),
              opt_.features.empty() ? "" : (", " + opt_.features + " (" + std::to_string(images().count) + " x " +
                                            std::to_string(format_.features) + " " +
                                            (opt_.features_dtype == DType::F16 ? "float16" : "float32") + ")").c_str());
  if (!opt_.json) return;
  long correct = 0, total = 0;
  for (int c = 0; c < classes(); ++c) correct += confusion_[size_t(c) * classes() + c];
  for (long n : confusion_) total += n;
  JsonLine j;
  j.add("event", "summary").add("variant", egress_.variant).add("egress", egress_.rungs())
      .add("optimizations", build_.optimizations()).add("gpu", prop_.name).add("cudnn", long(cudnnGetVersion()))
      .add("date", today()).add("data", images().name).add("split", opt_.split).add("batch", opt_.batch)
      .add("workers", egress_.workers ? workers_ : 0).add("features", !opt_.features.empty()).add("images", images().count)
      .add("timed_batches", timed_batches_).add("timed_images", timed_images_).add("seconds", seconds_)
      .add("images_per_s", ips).add("ms_per_batch", timed_batches_ ? 1e3 * seconds_ / timed_batches_ : 0.0)
      .add("data_stall_pct", stall_pct).add("egress_wait_s", egress_wait_s_)
      .add("accuracy", total ? double(correct) / double(total) : 0.0);
  std::printf("%s\n", j.str().c_str());
}

}  // namespace

std::string network_description(const BuildSettings& b) {
  return std::string(dtype_name(b.precision)) + ", " + layout_name(b.layout) + ", " + loader_name(b.loader) +
         " loader, " + algo_policy_name(b.algo) + " conv algorithms (cuDNN " + conv_api_name(b.conv_api) +
         " API), batch norm with running statistics" +
         (b.fused_bn ? " in the conv epilogues (cuDNN fused, where it is faster)" : "");
}

int predict_main(const BuildSettings& build, const EgressSettings& egress, const PredictOptions& opt) {
  Predictor p(build, egress, opt);
  return p.run();
}
