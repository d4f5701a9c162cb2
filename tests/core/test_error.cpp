#include "core/error.h"
#include <gtest/gtest.h>
TEST(Error, FailThrows) { EXPECT_THROW(tessera::fail("x {}", 1), tessera::Error); }
