// Token secrets, their digests and the Authorization header.

#include "net/secrets.h"

#include <set>

#include <gtest/gtest.h>

namespace gpufleet::net {
namespace {

TEST(Secrets, SecretsAreWellFormedAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string secret = NewTokenSecret();
    EXPECT_EQ(secret.size(), 4u + 64u);
    EXPECT_TRUE(IsWellFormedSecret(secret)) << secret;
    EXPECT_TRUE(seen.insert(secret).second);
  }
  EXPECT_FALSE(IsWellFormedSecret("gpf_123"));
  EXPECT_FALSE(IsWellFormedSecret("xyz_" + std::string(64, 'a')));
  EXPECT_FALSE(IsWellFormedSecret("gpf_" + std::string(63, 'a') + "g"));
  const std::string id = NewTokenId();
  EXPECT_EQ(id.size(), 12u);
  EXPECT_EQ(id.substr(0, 4), "tok-");
}

TEST(Secrets, Sha256MatchesTheStandardVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Secrets, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(Secrets, BearerTokenReadsTheHeader) {
  EXPECT_EQ(BearerToken("Bearer gpf_x"), "gpf_x");
  EXPECT_EQ(BearerToken("bearer   gpf_x  "), "gpf_x");
  EXPECT_EQ(BearerToken("Basic dXNlcjpwYXNz"), std::nullopt);
  EXPECT_EQ(BearerToken("Bearer "), std::nullopt);
  EXPECT_EQ(BearerToken(""), std::nullopt);
}

}  // namespace
}  // namespace gpufleet::net
