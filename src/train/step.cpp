// The GPU work of one training step and of one evaluation batch (step.h).
#include "train/step.h"

#include "core/check.h"
#include "measure/profiling.h"

void enqueue_train_step(TrainingNetwork& net, const DeviceBatch& batch, const StepTargets& t,
                        const StepSettings& settings, cudaStream_t stream, const Accumulation& acc) {
  {
    NvtxRange r("forward", phase_color::kGreen);
    net.forward(batch.images, true);
    net.loss(batch.labels, t.totals, &t.scaler->scale, &t.params->step, settings.label_smoothing);
    // for --loss-log, without a sync: the first micro-batch's, as rank 0 logs its own slice
    if (acc.micro.first()) record_loss(t.totals, &t.params->loss_slot, t.loss_history, stream);
  }
  {
    NvtxRange r("backward", phase_color::kPurple);
    net.backward();
  }
  if (acc.micro.accumulates()) {
    NvtxRange r("accumulate", phase_color::kGrey);
    if (!acc.micro.last()) {
      acc.sums->add(acc.micro, stream);
      return;
    }
    if (!acc.folded_by_buckets) acc.sums->finish_all(stream);
  }
  {
    NvtxRange r("optimizer step", phase_color::kBlue);
    ParamStore& p = net.params();
    const SgdArgs a{p.master_all(), p.momentum_all(), p.weight_grads_all(), p.vector_grads_all(), p.working_copy(),
                    p.total(), p.weight_count(), p.act(), &t.params->lr, settings.momentum, settings.weight_decay,
                    settings.nesterov};
    check_grads_finite(a, t.scaler, stream);
    sgd_update(a, t.scaler, stream);
    if (t.average)
      ema_update(t.average, p.master_all(), p.total(), settings.ema_decay, &t.params->step, t.scaler, stream);
    loss_scale_update(t.scaler, settings.dynamic_loss_scale, settings.loss_scale_window, stream);
  }
}

FlipEvaluation::FlipEvaluation(const NetConfig& cfg)
    : images{cfg.batch, 3, cfg.image_side, cfg.image_side},
      mirrored(images.count() * dtype_size(cfg.dtype), "mirrored evaluation batch (--tta-flip)"),
      logits(size_t(cfg.batch) * cfg.classes * sizeof(float), "evaluation logits (--tta-flip)") {}

void enqueue_eval_step(TrainingNetwork& net, const DeviceBatch& batch, LossTotals* totals, FlipEvaluation* flip,
                       cudaStream_t stream) {
  net.forward(batch.images, false);
  if (flip) {  // the mirror's pass, and the mean of the two passes' logits where the loss reads them
    const NetConfig& cfg = net.config();
    CUDA_CHECK(
        cudaMemcpyAsync(flip->logits.get(), net.logits(), flip->logits.bytes(), cudaMemcpyDeviceToDevice, stream));
    flip_horizontal(batch.images, flip->mirrored.get(), flip->images, cfg.dtype, cfg.layout, stream);
    net.forward(flip->mirrored.get(), false);
    mean_into(net.logits(), flip->logits.as<float>(), flip->logits.bytes() / sizeof(float), stream);
  }
  net.loss(batch.labels, totals, nullptr, nullptr);
}
