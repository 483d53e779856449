// Numbers as the programs print them (core/format.h).
#include <gtest/gtest.h>

#include <climits>

#include "core/format.h"

TEST(Format, WithCommasGroupsThousandsAfterTheSign) {
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(15634), "15,634");
  EXPECT_EQ(with_commas(23520842), "23,520,842");
  EXPECT_EQ(with_commas(-999), "-999");
  EXPECT_EQ(with_commas(-100000), "-100,000");
  EXPECT_EQ(with_commas(LLONG_MIN), "-9,223,372,036,854,775,808");
}
