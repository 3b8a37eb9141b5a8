// The container part of a job spec: mounts and users as users write them, and each mistake named.

#include "core/container.h"

#include <gtest/gtest.h>

namespace gpufleet {
namespace {

TEST(ContainerMount, ReadsSourceTargetAndMode) {
  std::string error;
  auto read_only = ParseContainerMount("/datasets/imagenet:/data", error);
  ASSERT_TRUE(read_only) << error;
  EXPECT_EQ(read_only->source, "/datasets/imagenet");
  EXPECT_EQ(read_only->target, "/data");
  EXPECT_TRUE(read_only->read_only);  // datasets are the common case: read-only unless asked
  auto writable = ParseContainerMount("/ckpt/job-1:/ckpt:rw", error);
  ASSERT_TRUE(writable) << error;
  EXPECT_FALSE(writable->read_only);
  EXPECT_EQ(FormatContainerMount(*writable), "/ckpt/job-1:/ckpt:rw");
}

TEST(ContainerMount, NamesEachMistake) {
  std::string error;
  EXPECT_FALSE(ParseContainerMount("/data", error));
  EXPECT_NE(error.find("SOURCE:TARGET"), std::string::npos) << error;
  EXPECT_FALSE(ParseContainerMount("/a:/b:rx", error));
  EXPECT_NE(error.find("'ro' or 'rw'"), std::string::npos) << error;
  EXPECT_FALSE(ParseContainerMount("rel:/b", error));
  EXPECT_NE(error.find("mount source"), std::string::npos) << error;
  EXPECT_FALSE(ParseContainerMount("/a:/", error));
  EXPECT_NE(error.find("other than '/'"), std::string::npos) << error;
  EXPECT_FALSE(ParseContainerMount("/a:/b/../../etc", error));
  EXPECT_NE(error.find("'..'"), std::string::npos) << error;
}

TEST(ContainerSpec, ValidatesImageMountsAndUser) {
  EXPECT_FALSE(ValidateContainerSpec({}));
  EXPECT_FALSE(ValidateContainerSpec({"localhost/train:1", {{"/d", "/data", true}}, "1000:1000"}));
  EXPECT_FALSE(ValidateContainerSpec({"/images/train.tar", {}, "0"}));
  auto error = ValidateContainerSpec({"", {{"/d", "/data", true}}, ""});
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("need an 'image'"), std::string::npos) << *error;
  error = ValidateContainerSpec({"bad image", {}, ""});
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("space"), std::string::npos) << *error;
  error = ValidateContainerSpec({"-it", {}, ""});
  ASSERT_TRUE(error);
  error = ValidateContainerSpec({std::string(kMaxImageReferenceBytes + 1, 'a'), {}, ""});
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("at most"), std::string::npos) << *error;
  error = ValidateContainerSpec({"img", {{"/a", "/x", true}, {"/b", "/x", false}}, ""});
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("two mounts"), std::string::npos) << *error;
  error = ValidateContainerSpec({"img", {}, "alice"});
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("UID or UID:GID"), std::string::npos) << *error;
  ContainerSpec many{"img", {}, ""};
  for (size_t i = 0; i <= kMaxContainerMounts; ++i)
    many.mounts.push_back({"/src", "/t" + std::to_string(i), true});
  EXPECT_TRUE(ValidateContainerSpec(many));
}

TEST(ContainerUser, ReadsUidAndGid) {
  std::string error;
  auto user = ParseContainerUser("1000", error);
  ASSERT_TRUE(user) << error;
  EXPECT_EQ(user->uid, 1000u);
  EXPECT_FALSE(user->gid);
  user = ParseContainerUser("1000:50", error);
  ASSERT_TRUE(user) << error;
  EXPECT_EQ(*user->gid, 50u);
  EXPECT_FALSE(ParseContainerUser("1000:", error));
  EXPECT_FALSE(ParseContainerUser("-1", error));
}

}  // namespace
}  // namespace gpufleet
