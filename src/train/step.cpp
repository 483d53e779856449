// The GPU work of one training step and of one evaluation batch (step.h).
#include "train/step.h"

#include "measure/profiling.h"

void enqueue_train_step(TrainingNetwork& net, const DeviceBatch& batch, const StepTargets& t, const SgdSettings& sgd,
                        cudaStream_t stream, const Accumulation& acc) {
  {
    NvtxRange r("forward", phase_color::kGreen);
    net.forward(batch.images, true);
    net.loss(batch.labels, t.totals, &t.scaler->scale, &t.params->step);
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
                    p.total(), p.weight_count(), p.act(), &t.params->lr, sgd.momentum, sgd.weight_decay,
                    sgd.nesterov};
    check_grads_finite(a, t.scaler, stream);
    sgd_update(a, t.scaler, stream);
    loss_scale_update(t.scaler, sgd.dynamic_loss_scale, sgd.loss_scale_window, stream);
  }
}

void enqueue_eval_step(TrainingNetwork& net, const DeviceBatch& batch, LossTotals* totals) {
  net.forward(batch.images, false);
  net.loss(batch.labels, totals, nullptr, nullptr);
}
