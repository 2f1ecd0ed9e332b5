// .npy reading and writing (include/opforge/npy.h): round trips of every dtype through files and
// memory, the bf16 rule (Note [npy bf16]), the header numpy expects, and one test per kind of
// malformed file, each of which must be an Error(io) naming the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "opforge/error.h"
#include "opforge/npy.h"

namespace opforge {
namespace {

namespace fs = std::filesystem;

// A scratch folder per test (ctest runs tests in parallel processes).
class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("opforge_npy_" + std::to_string(getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Fills a tensor with distinct, exactly representable values of its dtype.
Tensor sample(DType dtype, const Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dtype == DType::u8 ? double(i % 2) : (i % 2 ? -1.0 : 1.0) * double(i) * 0.5;
    if (dtype == DType::i32 || dtype == DType::i64) v = double(i) * 1000 - 3;
    store_from_double(t.data(), dtype, i, v);
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), size_t(a.nbytes())) == 0);
}

// An .npy image from a header dict written by hand (padded like numpy's) and raw data bytes.
std::vector<uint8_t> npy_image(const std::string& dict, const std::string& data, int major = 1) {
  const size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  for (size_t i = 0; i < preamble - 8; ++i) out += char((header.size() >> (8 * i)) & 0xff);
  out += header + data;
  return {out.begin(), out.end()};
}
std::string f32_data(int n) { return std::string(size_t(n) * 4, '\0'); }

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              std::streamsize(bytes.size()));
}

// ---- round trips ---------------------------------------------------------------------------
TEST_F(Npy, EveryDtypeRoundTripsThroughAFile) {
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : {Shape{2, 3}, Shape{5}, Shape{}, Shape{0, 4}, Shape{2, 1, 3, 2}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + shape.str());
      Tensor t = sample(dtype, shape);
      write_npy(path("t.npy"), t, NpyBf16::raw_bits);
      Tensor back = read_npy(path("t.npy"));
      EXPECT_TRUE(same_bytes(t, back)) << back.view().str();
      EXPECT_TRUE(back.view().is_contiguous());
      EXPECT_TRUE(back.device().is_cpu());
    }
  }
}

TEST_F(Npy, EveryDtypeRoundTripsThroughMemory) {
  for (DType dtype : kAllDTypes) {
    Tensor t = sample(dtype, {3, 7});
    Tensor back = read_npy_bytes(write_npy_bytes(t, NpyBf16::raw_bits));
    EXPECT_TRUE(same_bytes(t, back)) << dtype_name(dtype);
  }
}

TEST_F(Npy, Bf16IsWrittenAsExactF32ByDefault) {
  Tensor t = Tensor::empty({4}, DType::bf16);
  const uint16_t bits[4] = {0x3f80, 0xc2f7, 0x0001, 0x7f80};  // 1, -123.5, tiny subnormal, Inf
  std::memcpy(t.data(), bits, sizeof bits);
  write_npy(path("bf16.npy"), t);
  Tensor back = read_npy(path("bf16.npy"));
  ASSERT_EQ(back.dtype(), DType::f32);
  ASSERT_EQ(back.shape(), Shape({4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f32_bits(back.ptr<float>()[i]), uint32_t(bits[i]) << 16);
}

TEST_F(Npy, Bf16RawBitsAreWrittenAsU2AndReadBackAsBf16) {
  Tensor t = sample(DType::bf16, {3});
  std::vector<uint8_t> bytes = write_npy_bytes(t, NpyBf16::raw_bits);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find("'descr': '<u2'"), std::string::npos);
  EXPECT_TRUE(same_bytes(t, read_npy_bytes(bytes)));
}

TEST_F(Npy, StridedAndPaddedViewsAreWrittenInCOrder) {
  Tensor storage = Tensor::empty({3, 5}, DType::f32);
  for (int i = 0; i < 15; ++i) storage.ptr<float>()[i] = float(i);
  const int64_t strides[] = {5, 1};
  TensorView padded(storage.data(), DType::f32, {3, 4}, strides);  // rows of 4 with stride 5
  Tensor back = read_npy_bytes(write_npy_bytes(padded));
  ASSERT_EQ(back.shape(), Shape({3, 4}));
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(back.ptr<float>()[r * 4 + c], float(r * 5 + c));
  const int64_t transposed_strides[] = {1, 5};
  TensorView transposed(storage.data(), DType::f32, {5, 3}, transposed_strides);
  Tensor t = read_npy_bytes(write_npy_bytes(transposed));
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(t.ptr<float>()[r * 3 + c], float(c * 5 + r));
}

TEST_F(Npy, HeaderIsWhatNumpyWrites) {
  std::vector<uint8_t> bytes = write_npy_bytes(sample(DType::f32, {2, 3}));
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8), 0);
  const size_t header_len = bytes[8] | size_t(bytes[9]) << 8;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header(bytes.begin() + 10, bytes.begin() + 10 + long(header_len));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << header;
  EXPECT_EQ(bytes.size(), 10 + header_len + 24);
  const std::vector<uint8_t> one_d_bytes = write_npy_bytes(sample(DType::i64, {4}));
  const std::string one_d(one_d_bytes.begin(), one_d_bytes.end());
  EXPECT_NE(one_d.find("'<i8'"), std::string::npos);
  EXPECT_NE(one_d.find("'shape': (4,)"), std::string::npos);
  auto scalar = write_npy_bytes(sample(DType::u8, {}));
  EXPECT_NE(std::string(scalar.begin(), scalar.end()).find("'shape': ()"), std::string::npos);
}

TEST_F(Npy, ReadsVersions2And3BoolAndPython2Shapes) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  for (int major : {2, 3}) {
    Tensor t = read_npy_bytes(npy_image(dict, f32_data(2), major));
    EXPECT_EQ(t.shape(), Shape({2}));
  }
  Tensor b = read_npy_bytes(npy_image("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                                      std::string("\x01\x00\x01", 3)));
  EXPECT_EQ(b.dtype(), DType::u8);
  EXPECT_EQ(b.ptr<uint8_t>()[0], 1);
  EXPECT_EQ(b.ptr<uint8_t>()[1], 0);
  Tensor old = read_npy_bytes(npy_image(
      "{\"descr\": \"<f4\", \"shape\": (1L, 2L), \"fortran_order\": False}", f32_data(2)));
  EXPECT_EQ(old.shape(), Shape({1, 2}));
}

// ---- malformed files ---------------------------------------------------------------------------
// Expects read_npy_bytes to throw Error(io) whose message names the file and contains `problem`.
void expect_io_error(const std::vector<uint8_t>& bytes, const std::string& problem) {
  try {
    Tensor t = read_npy_bytes(bytes, "case.npy");
    ADD_FAILURE() << "accepted a file that should fail with '" << problem << "': " << t.view().str();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("case.npy"), std::string::npos) << what;
    EXPECT_NE(what.find(problem), std::string::npos) << "expected '" << problem << "' in: " << what;
  }
}

std::string dict_with(const std::string& descr, const std::string& order, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
}

TEST_F(Npy, RejectsBadMagicTruncationAndVersions) {
  std::vector<uint8_t> good = npy_image(dict_with("<f4", "False", "(2,)"), f32_data(2));
  expect_io_error({}, "bad magic");
  expect_io_error({'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0}, "bad magic");
  expect_io_error({good.begin(), good.begin() + 7}, "truncated preamble");
  expect_io_error({good.begin(), good.begin() + 9}, "truncated preamble");
  expect_io_error({good.begin(), good.begin() + 40}, "truncated header");
  std::vector<uint8_t> v4 = good;
  v4[6] = 4;
  expect_io_error(v4, "unsupported format version 4.0");
  std::vector<uint8_t> huge_len = npy_image(dict_with("<f4", "False", "(2,)"), f32_data(2), 2);
  huge_len[11] = 0x7f;  // header length ~2 GiB, far past the end
  expect_io_error(huge_len, "truncated header");
}

TEST_F(Npy, RejectsDtypesOutsideTheTable) {
  expect_io_error(npy_image(dict_with("<c8", "False", "(2,)"), f32_data(4)), "unsupported dtype '<c8'");
  expect_io_error(npy_image(dict_with(">f4", "False", "(2,)"), f32_data(2)), "big-endian");
  expect_io_error(npy_image(dict_with(">i8", "False", "(1,)"), f32_data(2)), "big-endian");
  expect_io_error(npy_image(dict_with("<U3", "False", "(1,)"), f32_data(3)), "unsupported dtype");
  expect_io_error(npy_image("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                            f32_data(1)),
                  "structured");
}

TEST_F(Npy, RejectsFortranOrder) {
  expect_io_error(npy_image(dict_with("<f4", "True", "(2, 2)"), f32_data(4)), "fortran_order True");
}

TEST_F(Npy, RejectsShapeAndSizeMismatch) {
  expect_io_error(npy_image(dict_with("<f4", "False", "(2, 3)"), f32_data(5)), "data size mismatch");
  expect_io_error(npy_image(dict_with("<f4", "False", "(2, 3)"), f32_data(7)), "data size mismatch");
  expect_io_error(npy_image(dict_with("<f4", "False", "()"), ""), "data size mismatch");
}

TEST_F(Npy, RejectsHugeAndNegativeDims) {
  expect_io_error(npy_image(dict_with("<f4", "False", "(9223372036854775808,)"), ""),
                  "dimension overflows int64");
  expect_io_error(npy_image(dict_with("<f4", "False", "(4294967296, 4294967296)"), ""),
                  "product of the dims overflows int64");
  expect_io_error(npy_image(dict_with("<f8", "False", "(2305843009213693952,)"), ""),
                  "data size in bytes overflows int64");
  // Fits in int64 but the file is tiny: rejected before anything is allocated.
  expect_io_error(npy_image(dict_with("<f4", "False", "(1000000000000,)"), ""), "data size mismatch");
  expect_io_error(npy_image(dict_with("<f4", "False", "(-1,)"), ""), "negative dimension");
  expect_io_error(npy_image(dict_with("<f4", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), f32_data(1)),
                  "more than 8 dims");
}

TEST_F(Npy, RejectsGarbageDicts) {
  const std::string data = f32_data(2);
  expect_io_error(npy_image("not a dict", data), "malformed header");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': False}", data), "no 'shape'");
  expect_io_error(npy_image("{'fortran_order': False, 'shape': (2,)}", data), "no 'descr'");
  expect_io_error(npy_image("{'descr': '<f4', 'shape': (2,)}", data), "no 'fortran_order'");
  expect_io_error(npy_image(dict_with("<f4", "False", "(2,)") + " extra", data), "after the dict");
  expect_io_error(npy_image("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", data),
                  "malformed header");
  expect_io_error(npy_image("{'descr': '<f4", data), "unterminated string");
  expect_io_error(npy_image("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                            data),
                  "duplicate key 'descr'");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data),
                  "unexpected key 'x'");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", data),
                  "fortran_order is not True or False");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", data),
                  "shape is not a tuple");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}", data),
                  "expected a dimension");
  expect_io_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2", data),
                  "malformed header");
  expect_io_error(npy_image("", data), "malformed header");
}

TEST_F(Npy, FileErrorsNameThePath) {
  const std::string missing = path("missing.npy");
  try {
    read_npy(missing);
    ADD_FAILURE() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string bad = path("bad.npy");
  write_file(bad, npy_image(dict_with("<f4", "False", "(2, 3)"), f32_data(5)));
  try {
    read_npy(bad);
    ADD_FAILURE() << "read a short file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data size mismatch"), std::string::npos) << e.what();
  }
  const std::string unwritable = path("no_such_dir/out.npy");
  try {
    write_npy(unwritable, sample(DType::f32, {2}));
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find(unwritable), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_npy_bytes(TensorView{}), Error);
}

}  // namespace
}  // namespace opforge

// A zero dim makes the element count 0, but the other dims still bound the strides: a header
// whose non-zero dims overflow int64 is malformed (found by npy_fuzz).
TEST(NpyShape, ZeroDimDoesNotHideAnOverflowingShape) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (0, 87745780, 1427, 8141, 741420854777, 8141, 0), }";
  header.resize(118, ' ');
  header += '\n';
  std::vector<uint8_t> file = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size()), 0};
  file.insert(file.end(), header.begin(), header.end());
  try {
    opforge::read_npy_bytes(file, "zero_dim.npy");
    FAIL() << "expected an error";
  } catch (const opforge::Error& e) {
    EXPECT_EQ(e.code(), opforge::ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(opforge::Shape({0, int64_t(1) << 40, int64_t(1) << 40}), opforge::Error);
}
