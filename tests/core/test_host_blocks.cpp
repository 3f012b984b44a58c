// Host storage: large blocks freed by tensors are kept and handed out again for the same
// size (no page faults for a model run over and over); a size that finds none takes new
// memory and leaves the kept ones; past the limit the blocks freed longest ago go back first;
// small tensors and the values written are unaffected.
#include <gtest/gtest.h>

#include "core/host_blocks.h"
#include "normcore/normcore.h"

namespace nc = normcore;
namespace nd = normcore::detail;

namespace {

constexpr int64_t kFloats = 3 << 20;  // 12 MiB
constexpr size_t kMiB = size_t{1} << 20;

// Every test starts with nothing kept and the default limit, and leaves it so.
class HostBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nd::host_keeps_blocks()) GTEST_SKIP() << "blocks are not kept under AddressSanitizer";
    nd::host_release_blocks();
    limit_ = nd::host_block_limit(size_t{1} << 40);
    nd::host_block_limit(limit_);
  }
  void TearDown() override {
    if (!nd::host_keeps_blocks()) return;
    nd::host_block_limit(limit_);
    nd::host_release_blocks();
  }
  size_t limit_ = 0;
};

}  // namespace

TEST_F(HostBlocks, LargeBlocksAreReusedForTheirSize) {
  const void* first = nullptr;
  {
    nc::Tensor a = nc::full({kFloats}, 1.5);
    first = a.data_ptr();
  }
  EXPECT_EQ(nd::host_cached_bytes(), 12 * kMiB);
  {
    // The same size: the same block, written afresh.
    nc::Tensor b = nc::full({kFloats}, -2.0);
    EXPECT_EQ(b.data_ptr(), first);
    EXPECT_EQ(nd::host_cached_bytes(), 0u);
    EXPECT_EQ(b.to_vector<float>()[kFloats - 1], -2.0f);
    // Two live tensors of that size never share it.
    nc::Tensor c = nc::full({kFloats}, 3.0);
    EXPECT_NE(c.data_ptr(), b.data_ptr());
    EXPECT_EQ(b.to_vector<float>()[0], -2.0f);
  }
  EXPECT_EQ(nd::host_cached_bytes(), 24 * kMiB);
  // Small tensors are not kept.
  { nc::Tensor small = nc::ones({1000}); }
  EXPECT_EQ(nd::host_cached_bytes(), 24 * kMiB);
}

TEST_F(HostBlocks, AnotherSizeLeavesTheKeptBlocks) {
  nc::Tensor b = nc::full({kFloats}, 2.0);  // in use throughout: 25 MiB in use at the peak below
  const void* kept = nullptr;
  {
    nc::Tensor a = nc::full({kFloats}, 1.0);
    kept = a.data_ptr();
  }
  {
    // 13 MiB finds nothing of its size: new memory, the 12 MiB block stays kept.
    nc::Tensor d = nc::full({kFloats + (1 << 18)}, 2.0);
    EXPECT_NE(d.data_ptr(), kept);
    EXPECT_EQ(nd::host_cached_bytes(), 12 * kMiB);
  }
  EXPECT_EQ(nd::host_cached_bytes(), 25 * kMiB);
  nc::Tensor again = nc::empty({kFloats});
  EXPECT_EQ(again.data_ptr(), kept);
}

TEST_F(HostBlocks, PastTheLimitTheBlocksFreedLongestAgoGoBack) {
  nd::host_block_limit(30 * kMiB);
  const void* older = nullptr;
  const void* newer = nullptr;
  {
    nc::Tensor a = nc::full({kFloats}, 1.0);
    nc::Tensor b = nc::full({kFloats}, 2.0);
    nc::Tensor c = nc::full({kFloats + (1 << 18)}, 3.0);
    older = a.data_ptr();
    newer = b.data_ptr();
    a = nc::Tensor();  // freed first
    b = nc::Tensor();
    EXPECT_EQ(nd::host_cached_bytes(), 24 * kMiB);
  }  // c's 13 MiB pushes past 30: a's block goes back, b's stays
  EXPECT_EQ(nd::host_cached_bytes(), 25 * kMiB);
  nc::Tensor d = nc::empty({kFloats});
  EXPECT_EQ(d.data_ptr(), newer);
  EXPECT_NE(d.data_ptr(), older);
  EXPECT_EQ(nd::host_cached_bytes(), 13 * kMiB);
  // Lowering the limit gives back what is over it at once.
  nd::host_block_limit(8 * kMiB);
  EXPECT_EQ(nd::host_cached_bytes(), 0u);
}

TEST_F(HostBlocks, NoMoreIsKeptThanWasEverInUseAtOnce) {
  // One size at a time, 12, 13 and 14 MiB: what is kept never passes the most the process had
  // in use at once (in a process of its own, as ctest runs each test, 14 MiB: the 12 MiB block
  // goes back when the 14 MiB one is freed).
  for (int64_t extra = 0; extra < 3; ++extra) {
    { nc::Tensor t = nc::full({kFloats + extra * (1 << 18)}, 1.0); }
    EXPECT_LE(nd::host_cached_bytes(), nd::host_peak_bytes());
  }
  EXPECT_GE(nd::host_peak_bytes(), 14 * kMiB);
}
