// Plain CPU references of every layer, in double precision, that the GPU kernels are tested against.
//
// Written to be obviously correct rather than fast: loops that follow the definitions, NCHW
// activations [N][C][H][W], KCRS filters [K][C][R][S], row-major matrices. The tests transpose
// NHWC / KRSC data with the helpers at the end. Each backward here is itself checked against
// central finite differences of its forward (tests/test_reference.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ref {

using Vec = std::vector<double>;

struct Dims {  // an activation tensor's N, C, H, W
  int n = 0, c = 0, h = 0, w = 0;
  size_t count() const { return size_t(n) * c * h * w; }
  size_t per_channel() const { return size_t(n) * h * w; }  // elements one BN channel averages over
  size_t at(int in, int ic, int ih, int iw) const { return ((size_t(in) * c + ic) * h + ih) * w + iw; }
};

// ---- convolution (cross-correlation, as cuDNN computes it) ----------------------------------------
struct ConvDims {
  int n, c, h, w;  // input
  int k, r, s;     // output channels, filter height and width
  int stride, pad; // the same in both directions
  int out_h() const { return (h + 2 * pad - r) / stride + 1; }
  int out_w() const { return (w + 2 * pad - s) / stride + 1; }
  Dims input() const { return {n, c, h, w}; }
  Dims output() const { return {n, k, out_h(), out_w()}; }
  size_t filter_count() const { return size_t(k) * c * r * s; }
};

// y[n,k,p,q] = sum_{c,r,s} x[n,c,p*stride-pad+r, q*stride-pad+s] * w[k,c,r,s] (zero padding)
Vec conv2d_forward(const ConvDims& g, const Vec& x, const Vec& w);
// dx = the transpose of forward applied to dy
Vec conv2d_backward_data(const ConvDims& g, const Vec& dy, const Vec& w);
// dw[k,c,r,s] = sum_{n,p,q} dy[n,k,p,q] * x[n,c,p*stride-pad+r, q*stride-pad+s]
Vec conv2d_backward_filter(const ConvDims& g, const Vec& x, const Vec& dy);

// ---- batch norm --------------------------------------------------------------------------------
struct BnStats {
  Vec mean;    // per channel
  Vec var;     // biased (divided by N*H*W): what training normalizes with
  Vec invstd;  // 1 / sqrt(var + eps)
};
BnStats bn_batch_stats(const Dims& d, const Vec& x, double eps);
// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance.
void bn_update_running(const BnStats& st, size_t per_channel, double momentum, Vec& running_mean,
                       Vec& running_var);

struct BnCoefs {  // y = x * scale + shift per channel
  Vec scale, shift;
};
BnCoefs bn_train_coefs(const BnStats& st, const Vec& gamma, const Vec& beta);
BnCoefs bn_eval_coefs(const Vec& gamma, const Vec& beta, const Vec& running_mean,
                      const Vec& running_var, double eps);
Vec bn_affine(const Dims& d, const Vec& x, const BnCoefs& k);

// Training forward without ReLU or residual: gamma * (x - mean) * invstd + beta.
struct BnForward {
  BnStats stats;
  Vec y;
};
BnForward bn_train_forward(const Dims& d, const Vec& x, const Vec& gamma, const Vec& beta, double eps);
Vec bn_eval_forward(const Dims& d, const Vec& x, const Vec& gamma, const Vec& beta,
                    const Vec& running_mean, const Vec& running_var, double eps);

// Backward of the training forward above, given dz = dL/d(its output):
//   dbeta = sum dz, dgamma = sum dz * xhat,
//   dx = gamma * invstd / M * (M * dz - dbeta - xhat * dgamma).
struct BnGrads {
  Vec dgamma, dbeta, dx;
};
BnGrads bn_backward(const Dims& d, const Vec& dz, const Vec& x, const Vec& gamma, const BnStats& st);

// ---- elementwise -------------------------------------------------------------------------------
Vec add(const Vec& a, const Vec& b);
Vec relu(const Vec& x);
Vec relu_backward(const Vec& dy, const Vec& y);  // dy * (y > 0)

// ---- global average pool: [N,C,H,W] -> [N,C] ------------------------------------------------------
Vec avgpool_forward(const Dims& d, const Vec& x);
Vec avgpool_backward(const Dims& d, const Vec& dy);

// ---- linear: y [N,out] = x [N,in] W^T, W [out,in], all row-major ------------------------------------
Vec linear_forward(int n, int in, int out, const Vec& x, const Vec& w);
struct LinearGrads {
  Vec dw, dx;
};
LinearGrads linear_backward(int n, int in, int out, const Vec& x, const Vec& w, const Vec& dy);

// ---- softmax cross-entropy on logits + bias; label -1 is padding --------------------------------
// The target of a valid row: one-hot at its label, or with label smoothing e (PyTorch's
// CrossEntropyLoss(label_smoothing=e)) (1 - e) * onehot + e / classes.
struct XentResult {
  Vec logits;         // logits + bias
  double loss_sum;    // sum over valid rows of -sum_j target_j * log softmax_j
  double loss;        // loss_sum / valid (0 when none is valid)
  int correct;        // valid rows whose first maximal logit is the label
  int valid;
  Vec dlogits;        // d(loss * loss_scale) / d logits: (softmax - target) * loss_scale / valid
  Vec dbias;          // sum over rows of dlogits
};
XentResult softmax_xent(int n, int classes, const Vec& logits, const Vec& bias,
                        const std::vector<int32_t>& labels, double loss_scale, double label_smoothing = 0.0);

// ---- SGD with momentum, PyTorch's formula ------------------------------------------------------
// g = grad + weight_decay * w; buf = momentum * buf + g;
// w -= lr * (nesterov ? g + momentum * buf : buf). The buffer starts at zero.
void sgd_step(Vec& w, Vec& buf, const Vec& grad, double lr, double momentum, double weight_decay,
              bool nesterov);

// ---- exponential moving average of the weights -----------------------------------------------
// average = decay * average + (1 - decay) * weights.
void ema_update(Vec& average, const Vec& weights, double decay);

// ---- a horizontal flip of an NCHW batch: column x of every row from column w - 1 - x ---------------
Vec flip_horizontal(const Dims& d, const Vec& x);

// ---- layouts -----------------------------------------------------------------------------------
Vec nchw_to_nhwc(const Dims& d, const Vec& x);
Vec nhwc_to_nchw(const Dims& d, const Vec& x);
Vec kcrs_to_krsc(int k, int c, int r, int s, const Vec& w);
Vec krsc_to_kcrs(int k, int c, int r, int s, const Vec& w);

// ---- comparison --------------------------------------------------------------------------------
// ||got - want|| / ||want|| (2-norms); NaN when any element of got is not finite; 0 for two zeros.
double rel_error(const Vec& got, const Vec& want);

}  // namespace ref
