// Loading a broken model directory fails with one message naming the file, the tensor, what was
// expected and what was found.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/synthetic.h"
#include "support/model_harness.h"
#include "util/error.h"

namespace tokenmill::testing {
namespace {

// Rewrites dir/model.safetensors through `edit`, which may drop or change tensors.
void rewrite(const std::string& dir,
             const std::function<bool(const TensorInfo&, TensorToWrite&)>& edit) {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorToWrite> out;
  {
    Checkpoint ck = Checkpoint::open(dir);
    for (const TensorInfo& t : ck.tensors()) {
      TensorToWrite w{t.name, t.dtype, t.shape, nullptr, t.nbytes};
      if (!edit(t, w)) continue;
      bytes.emplace_back(t.data, t.data + std::min(t.nbytes, w.nbytes));
      bytes.back().resize(w.nbytes);
      out.push_back(w);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = bytes[i].data();
  std::filesystem::remove(dir + "/model.safetensors");
  write_safetensors(dir + "/model.safetensors", out);
}

std::string load_error(const std::string& dir) {
  ThreadPool pool(1);
  auto be = make_cpu_backend(pool);
  try {
    Model::load(dir, *be);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BindingErrors, MissingTensorNamesIt) {
  std::string dir = temp_dir("bind-missing");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  rewrite(dir, [](const TensorInfo& t, TensorToWrite&) {
    return t.canonical != "layers.2.linear_attn.in_proj_z.weight";
  });
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("model.language_model.layers.2.linear_attn.in_proj_z.weight"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
}

TEST(BindingErrors, WrongShapeSaysExpectedAndFound) {
  std::string dir = temp_dir("bind-shape");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  rewrite(dir, [](const TensorInfo& t, TensorToWrite& w) {
    if (t.canonical == "layers.3.self_attn.k_proj.weight") {
      w.shape = {t.shape[0] / 2, t.shape[1]};
      w.nbytes = t.nbytes / 2;
    }
    return true;
  });
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("layers.3.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected shape [64, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found [32, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(BindingErrors, WrongDtypeIsRejected) {
  std::string dir = temp_dir("bind-dtype");
  write_synthetic_checkpoint(dir, SyntheticSpec{});
  rewrite(dir, [](const TensorInfo& t, TensorToWrite& w) {
    if (t.canonical == "layers.0.mlp.up_proj.weight") w.dtype = DType::I16;
    return true;
  });
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("layers.0.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I16"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tokenmill::testing
