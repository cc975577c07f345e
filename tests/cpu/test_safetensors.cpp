// The safetensors reader and writer (src/io/safetensors.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/safetensors.h"

namespace mxmoe {
namespace {

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/mxmoe_st_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good());
  }

  // A file with `header` as its JSON and `data` as its data section; the length field is the
  // header's size unless `length` overrides it.
  std::string RawFile(const std::string& header, const std::string& data, int64_t length = -1) {
    const uint64_t len = length < 0 ? header.size() : static_cast<uint64_t>(length);
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &len, 8);
    const std::string path = Path("raw" + std::to_string(raw_count_++) + ".safetensors");
    WriteBytes(path, bytes + header + data);
    return path;
  }

  // Open is refused and the message mentions `needle` and the file.
  static void ExpectRefused(const std::string& path, const std::string& needle) {
    std::unique_ptr<SafetensorsFile> f;
    const Status st = SafetensorsFile::Open(path, &f);
    ASSERT_FALSE(st.ok()) << "accepted " << path;
    EXPECT_EQ(f, nullptr);
    EXPECT_NE(st.message().find(needle), std::string::npos)
        << "message: " << st.message() << "\nexpected to mention: " << needle;
    EXPECT_NE(st.message().find(path), std::string::npos) << "message does not name the file: " << st.message();
  }

  std::vector<std::string> DirEntries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename());
    return names;
  }

  std::string dir_;
  int raw_count_ = 0;
};

std::vector<uint8_t> RandomBytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(SafetensorsDType, NamesAndSizes) {
  for (DType t : kAllDTypes) {
    const auto back = DTypeFromName(DTypeName(t));
    ASSERT_TRUE(back.has_value()) << DTypeName(t);
    EXPECT_EQ(*back, t);
    EXPECT_GT(DTypeSize(t), 0u);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_STREQ(DTypeName(DType::kF8E5M2), "F8_E5M2");
  EXPECT_FALSE(DTypeFromName("bf16").has_value());  // the header spelling is exact
  EXPECT_FALSE(DTypeFromName("F4").has_value());
}

TEST_F(SafetensorsTest, RoundTripEveryDType) {
  std::mt19937_64 rng(20240611);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorToWrite> tensors;
  for (DType t : kAllDTypes) {
    const std::vector<int64_t> shape = {3, 5};
    buffers.push_back(RandomBytes(15 * DTypeSize(t), rng));
    tensors.push_back({std::string("t_") + DTypeName(t), t, shape, buffers.back().data(), buffers.back().size()});
  }
  buffers.push_back(RandomBytes(4, rng));
  tensors.push_back({"scalar", DType::kF32, {}, buffers.back().data(), 4});
  tensors.push_back({"empty", DType::kBF16, {0, 7}, nullptr, 0});
  buffers.push_back(RandomBytes(3 * 2 * 4 * 8, rng));
  tensors.push_back({"rank4", DType::kI64, {3, 2, 4, 1}, buffers.back().data(), buffers.back().size()});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "quote \" and \u00e9"}};
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, meta).ok());

  std::unique_ptr<SafetensorsFile> f;
  const Status st = SafetensorsFile::Open(path, &f);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->NumTensors(), tensors.size());
  for (const TensorToWrite& w : tensors) {
    const TensorInfo* t = f->Find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    ASSERT_EQ(t->nbytes, w.nbytes) << w.name;
    if (w.nbytes > 0) {
      EXPECT_EQ(std::memcmp(t->data, w.data, w.nbytes), 0) << w.name;
    }
  }
  EXPECT_EQ(f->Find("scalar")->NumElements(), 1);
  EXPECT_EQ(f->Find("empty")->NumElements(), 0);
  EXPECT_EQ(f->Find("absent"), nullptr);

  // Tensors are laid out in the given order, so Names() (data-offset order) repeats it; the
  // empty tensor sorts before the non-empty one at the same offset.
  std::vector<std::string> names = f->Names();
  ASSERT_EQ(names.size(), tensors.size());
  EXPECT_EQ(names.front(), "t_BOOL");
  EXPECT_EQ(names.back(), "rank4");

  // The data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(std::filesystem::file_size(path), 8 + header_len + f->data_size());
}

TEST_F(SafetensorsTest, EmptyFileWithNoTensors) {
  const std::string path = Path("none.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::Open(path, &f).ok());
  EXPECT_EQ(f->NumTensors(), 0u);
  EXPECT_TRUE(f->metadata().empty());
}

TEST_F(SafetensorsTest, AcceptsHolesAndPadding) {
  // Gaps between tensors and trailing bytes are allowed; only overlap is not.
  const std::string path = RawFile(
      R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
      R"( "b": {"dtype": "U16", "shape": [2], "data_offsets": [8, 12]},)"
      R"( "z": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]}}   )",
      std::string(16, 'x'));
  std::unique_ptr<SafetensorsFile> f;
  const Status st = SafetensorsFile::Open(path, &f);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(f->Names(), (std::vector<std::string>{"a", "z", "b"}));
  EXPECT_EQ(f->data_size(), 16u);
}

TEST_F(SafetensorsTest, RefusesMalformedFiles) {
  const std::string ok_entry = R"("a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})";
  const std::string data24(24, '\x11');

  {
    const std::string p = Path("short.safetensors");
    WriteBytes(p, "abc");
    ExpectRefused(p, "too short");
  }
  {
    const std::string p = Path("empty.safetensors");
    WriteBytes(p, "");
    ExpectRefused(p, "0 bytes, too short");
  }
  ExpectRefused(RawFile("{}", "", 1000), "header length 1000 exceeds");
  ExpectRefused(RawFile("{}", "", int64_t{1} << 40), "exceeds the limit");
  ExpectRefused(RawFile("{\"a\": ", ""), "not valid JSON");
  ExpectRefused(RawFile("", ""), "not valid JSON");
  ExpectRefused(RawFile("[1, 2]", ""), "header is a JSON array, expected an object");
  ExpectRefused(RawFile("{" + ok_entry + ", " + ok_entry + "}", data24), "duplicate key");
  ExpectRefused(RawFile(R"({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", "xx"),
                "unknown dtype 'F4'");
  ExpectRefused(RawFile(R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", data24),
                "needs 24 bytes");
  ExpectRefused(RawFile(R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", "short"),
                "past the end of the data section");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", data24),
                "begin 8 is greater than end 4");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
                        R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})",
                        data24),
                "overlap");
  ExpectRefused(RawFile(R"({"b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},)"
                        R"( "a": {"dtype": "U8", "shape": [24], "data_offsets": [0, 24]}})",
                        data24),
                "overlap");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})", ""),
                "not a non-negative integer");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 0]}})", ""),
                "not a non-negative integer");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})", ""),
                "overflows");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", "x"),
                "data_offsets must be [begin, end]");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", "x"),
                "data_offsets must be [begin, end]");
  ExpectRefused(RawFile(R"({"a": {"shape": [1], "data_offsets": [0, 1]}})", "x"), "missing field 'dtype'");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "data_offsets": [0, 1]}})", "x"), "missing field 'shape'");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [1]}})", "x"), "missing field 'data_offsets'");
  ExpectRefused(RawFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}})", "x"),
                "unknown field 'x'");
  ExpectRefused(RawFile(R"({"a": [1]})", ""), "tensor 'a' is a JSON array");
  ExpectRefused(RawFile(R"({"__metadata__": {"k": 1}})", ""), "'k' is a number, expected a string");
  ExpectRefused(RawFile(R"({"__metadata__": "x"})", ""), "__metadata__ is a string");
}

TEST_F(SafetensorsTest, RefusesTruncatedDataSection) {
  std::vector<uint8_t> a(64, 1), b(64, 2);
  const std::string path = Path("full.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kU8, {64}, a.data(), 64}, {"b", DType::kU16, {32}, b.data(), 64}}).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 5);
  ExpectRefused(path, "tensor 'b': data_offsets end 128 is past the end of the data section (123 bytes; file truncated?)");
}

TEST_F(SafetensorsTest, RefusesMissingFileAndDirectory) {
  ExpectRefused(Path("absent.safetensors"), "cannot open");
  ExpectRefused(dir_, "not a regular file");
}

TEST_F(SafetensorsTest, ExpectTensorMessages) {
  std::vector<uint8_t> scale(4 * 3, 7);
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x.weight_scale", DType::kU8, {4, 3}, scale.data(), scale.size()}}).ok());
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::Open(path, &f).ok());

  const TensorInfo* t = nullptr;
  EXPECT_TRUE(f->Get("x.weight_scale", DType::kU8, {4, 3}, &t).ok());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->data[5], 7);

  Status st = f->Get("x.weight_scale", DType::kU8, {4, 4}, &t);
  EXPECT_EQ(st.message(), "tensor 'x.weight_scale' in " + path + ": expected U8 [4, 4], found U8 [4, 3]");
  st = f->Get("x.weight_scale", DType::kI8, {4, 3}, &t);
  EXPECT_EQ(st.message(), "tensor 'x.weight_scale' in " + path + ": expected I8 [4, 3], found U8 [4, 3]");
  st = f->Get("topk_ids", DType::kI32, {1, 2}, &t);
  EXPECT_EQ(st.message(), "missing tensor 'topk_ids' in " + path);
  st = ExpectTensor(nullptr, "hidden_states", DType::kBF16, {}, "FILE");
  EXPECT_EQ(st.message(), "missing tensor 'hidden_states' in FILE");
}

TEST_F(SafetensorsTest, WriterFailureLeavesNoFile) {
  std::vector<uint8_t> a(16, 3);
  const std::string path = Path("out.safetensors");
  // Wrong byte count.
  Status st = WriteSafetensors(path, {{"a", DType::kF32, {5}, a.data(), a.size()}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("needs 20 bytes, given 16"), std::string::npos) << st.message();
  // Duplicate names, the reserved name.
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kU8, {16}, a.data(), 16}, {"a", DType::kU8, {16}, a.data(), 16}}).ok());
  EXPECT_FALSE(WriteSafetensors(path, {{"__metadata__", DType::kU8, {16}, a.data(), 16}}).ok());
  EXPECT_TRUE(DirEntries().empty());

  // A failed rewrite keeps the previous file intact.
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kU8, {16}, a.data(), 16}}).ok());
  const auto before = std::filesystem::file_size(path);
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kF64, {16}, a.data(), 16}}).ok());
  EXPECT_EQ(std::filesystem::file_size(path), before);
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"out.safetensors"});

  // A missing directory.
  st = WriteSafetensors(Path("no/such/dir.safetensors"), {{"a", DType::kU8, {16}, a.data(), 16}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("dir.safetensors"), std::string::npos) << st.message();
}

// Random corruptions of a valid file: every one is either accepted with in-bounds tensors or
// refused with a message; none crashes (run under the sanitizers to make this bite).
TEST_F(SafetensorsTest, CorruptedFilesAreRefusedCleanly) {
  std::mt19937_64 rng(4242);
  std::vector<uint8_t> a = RandomBytes(48, rng), b = RandomBytes(40, rng);
  const std::string good = Path("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, {{"alpha", DType::kF32, {3, 4}, a.data(), 48},
                                      {"beta", DType::kBF16, {4, 5}, b.data(), 40}},
                               {{"format", "pt"}})
                  .ok());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string path = Path("mutant.safetensors");
  const char kInteresting[] = {'{', '}', '[', ']', '"', ',', ':', '-', '0', '9', '\\', ' ', '\0', '\xff'};
  int accepted = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string m = bytes;
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) {  // truncate
      m.resize(rng() % m.size());
    } else {  // overwrite a few bytes, mostly in the length field and header
      const size_t header_end = std::min<size_t>(m.size(), 8 + 160);
      for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
        const size_t at = rng() % header_end;
        m[at] = kind == 1 ? static_cast<char>(rng()) : kInteresting[rng() % sizeof(kInteresting)];
      }
    }
    WriteBytes(path, m);
    std::unique_ptr<SafetensorsFile> f;
    const Status st = SafetensorsFile::Open(path, &f);
    if (!st.ok()) {
      EXPECT_FALSE(st.message().empty());
      EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
      continue;
    }
    ++accepted;
    for (const std::string& name : f->Names()) {
      const TensorInfo* t = f->Find(name);
      ASSERT_NE(t, nullptr);
      EXPECT_LE(t->data_begin + t->nbytes, f->data_size());
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < t->nbytes; ++i) sink = sink + t->data[i];  // in bounds
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations are harmless (e.g. inside the data section)
}

}  // namespace
}  // namespace mxmoe
