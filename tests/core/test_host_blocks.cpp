// Host storage: large blocks freed by tensors are kept and handed out again for the same
// size (no page faults for a model run over and over); a size that finds none gives the kept
// ones back; small tensors and the values written are unaffected.
#include <gtest/gtest.h>

#include "core/host_blocks.h"
#include "normcore/normcore.h"

namespace nc = normcore;
namespace nd = normcore::detail;

TEST(HostBlocks, LargeBlocksAreReusedForTheirSizeAndGivenBackForAnother) {
  if (!nd::host_keeps_blocks()) GTEST_SKIP() << "blocks are not kept under AddressSanitizer";
  constexpr int64_t kFloats = 3 << 20;  // 12 MiB
  nc::empty({kFloats + (3 << 18)});     // a size of its own: whatever an earlier test kept goes back
  const void* first = nullptr;
  {
    // Another size: the block above goes back too.
    nc::Tensor a = nc::full({kFloats}, 1.5);
    first = a.data_ptr();
  }
  EXPECT_EQ(nd::host_cached_bytes(), size_t{12} << 20);
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
  EXPECT_GE(nd::host_cached_bytes(), size_t{24} << 20);
  {
    // Another large size finds nothing kept: every kept block goes back to the system.
    nc::Tensor d = nc::empty({kFloats + (1 << 20)});
    EXPECT_EQ(nd::host_cached_bytes(), 0u);
  }
  // Small tensors are not kept.
  const size_t large = nd::host_cached_bytes();
  { nc::Tensor small = nc::ones({1000}); }
  EXPECT_EQ(nd::host_cached_bytes(), large);
}
