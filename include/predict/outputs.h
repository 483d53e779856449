// What bin/predict makes of a batch's outputs on the CPU, the seed's "process output": class
// probabilities, the top-k classes, one CSV row per image, the features in the type asked for, and
// the confusion counts. Pure functions of their inputs, so the egress workers may run them on any
// batch in any order; only writing the results (in batch order) is sequential.
//
// The logits the GPU hands over lack the classifier's bias (the loss kernel adds it while it
// computes the loss), so the probabilities here are softmax(logits + bias).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"
#include "data/dataset.h"

struct OutputFormat {
  int batch = 0, classes = 0, top_k = 1;
  int features = 0;                      // values per image copied from the GPU; 0 without --features
  DType features_in = DType::F32;        // as the network computes them
  DType features_out = DType::F32;       // as --features-dtype asks
  std::vector<float> bias;               // the classifier's, one per class
  std::vector<std::string> class_names;  // one per class

  // A batch's host buffer: the logits (fp32, batch x classes), then the features (batch x features).
  size_t logits_bytes() const { return size_t(batch) * classes * sizeof(float); }
  size_t features_bytes() const { return size_t(batch) * features * dtype_size(features_in); }
};

struct BatchResult {
  std::string csv;                // one line per image
  std::vector<uint8_t> features;  // rows x features in features_out
  std::vector<long> confusion;    // classes x classes: [true][predicted]
};

// The CSV's first line: id, label, label_name, predicted, predicted_name, then top1, p1 .. topK, pK.
std::string csv_header(const OutputFormat& f);
// The batch whose rows are data set images `images[0 .. rows)` (the padding rows of a last, partial
// batch are left out), from its host buffer. The id of a row is the image's file path when the data
// set has paths (image folders), else its index.
BatchResult process_batch(const OutputFormat& f, const Dataset& data, const uint32_t* images, int rows, const void* host);

// Probabilities of softmax(logits + bias): the sum in float (as the GPU's loss kernel forms it, so
// the top class is the one bin/train's evaluation counts), the rest in double; the top-k of them,
// most probable first (ties: the lower class first, as the kernel's argmax).
std::vector<double> class_probabilities(const float* logits, const std::vector<float>& bias);
std::vector<int> top_classes(const std::vector<double>& p, int k);

// "accuracy: 93.12% (9,312 of 10,000 images)" and the matrix as a table, rows the true class.
std::string confusion_report(const std::vector<long>& confusion, const std::vector<std::string>& class_names);
