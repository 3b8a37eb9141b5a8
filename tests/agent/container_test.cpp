// The OCI executor's pure parts and its image cache: CDI specs written and resolved, the
// runtime's config.json, cgroup paths, and images unpacked once, shared and collected by size.

#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <unistd.h>

#include "agent/command_runner.h"
#include "agent/image_cache.h"
#include "agent/oci_spec.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "gpufleet-container-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Two GPUs whose "device files" are links to /dev/null and /dev/zero: real character devices
// any user may stat, under names the CDI spec maps to /dev/nvidiaN.
std::vector<GpuInfo> LinkedGpus(const std::string& dir) {
  std::vector<GpuInfo> gpus(2);
  for (int i = 0; i < 2; ++i) {
    gpus[i].index = i;
    gpus[i].uuid = "GPU-" + std::to_string(i);
    const std::string file = dir + "/nvidia" + std::to_string(i);
    fs::create_symlink(i == 0 ? "/dev/null" : "/dev/zero", file);
    gpus[i].device_files = {file};
  }
  return gpus;
}

TEST(Cdi, TheAgentsSpecResolvesByUuidAndIndex) {
  TempDir dir;
  const std::string cdi = dir.path() + "/cdi";
  fs::create_directories(cdi);
  WriteFile(cdi + "/gpufleet.json", CdiSpecForGpus(LinkedGpus(dir.path()), {"/dev/full"}));

  CdiEdits edits;
  auto error = ResolveCdiDevices({"/nonexistent", cdi}, {"nvidia.com/gpu=GPU-1"}, edits);
  ASSERT_FALSE(error) << *error;
  ASSERT_EQ(edits.devices.size(), 2u);  // the GPU's node and the common one
  EXPECT_EQ(edits.devices[0].path, "/dev/full");
  EXPECT_EQ(edits.devices[1].path, "/dev/nvidia1");
  EXPECT_EQ(edits.devices[1].major, 1);
  EXPECT_EQ(edits.devices[1].minor, 5);  // /dev/zero's

  CdiEdits by_index;
  error = ResolveCdiDevices({cdi}, {"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"}, by_index);
  ASSERT_FALSE(error) << *error;
  EXPECT_EQ(by_index.devices.size(), 2u);  // one node for the two names of GPU 0

  CdiEdits unknown;
  error = ResolveCdiDevices({cdi}, {"nvidia.com/gpu=GPU-9"}, unknown);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("GPU-9"), std::string::npos) << *error;
  error = ResolveCdiDevices({cdi}, {"vendor.com/fpga=0"}, unknown);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("no CDI spec for kind vendor.com/fpga"), std::string::npos) << *error;
}

TEST(Cdi, AVendorYamlSpecAddsEnvMountsAndHooks) {
  TempDir dir;
  WriteFile(dir.path() + "/nvidia.yaml", R"(cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/null
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu
    containerPath: /usr/lib/x86_64-linux-gnu/driver
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
)");
  CdiEdits edits;
  auto error = ResolveCdiDevices({dir.path()}, {"nvidia.com/gpu=0"}, edits);
  ASSERT_FALSE(error) << *error;
  EXPECT_EQ(edits.env, std::vector<std::string>{"NVIDIA_VISIBLE_DEVICES=void"});
  ASSERT_EQ(edits.mounts.size(), 1u);
  EXPECT_EQ(edits.mounts[0].destination, "/usr/lib/x86_64-linux-gnu/driver");
  json hooks = json::parse(edits.hooks_json);
  EXPECT_EQ(hooks["createContainer"][0]["path"], "/usr/bin/nvidia-ctk");

  WriteFile(dir.path() + "/broken.json", "{not yaml: [");
  error = ResolveCdiDevices({dir.path()}, {"nvidia.com/gpu=0"}, edits);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("broken.json"), std::string::npos) << *error;
}

TEST(OciConfig, ClosesTheDeviceCgroupToAllButItsDevices) {
  ContainerPlan plan;
  plan.rootfs = "/var/lib/gpufleet/w1/rootfs";
  plan.args = {"/.gpufleet/init", "-g", "--", "python3", "train.py"};
  plan.env = {"PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=0"};
  plan.cwd = "/work";
  plan.uid = 1000;
  plan.gid = 1000;
  plan.devices = {{"/dev/nvidia3", "/dev/nvidia3", 'c', 195, 3, 0666}};
  plan.binds = {{"/datasets", "/data", {"rbind", "ro"}}};
  plan.cgroups_path = "/gpufleet/w1";
  json config = json::parse(OciConfigJson(plan));
  EXPECT_EQ(config["process"]["user"]["uid"], 1000);
  EXPECT_TRUE(config["process"]["noNewPrivileges"]);
  EXPECT_TRUE(config["process"]["capabilities"]["effective"].empty());  // not root: none
  EXPECT_EQ(config["linux"]["cgroupsPath"], "/gpufleet/w1");
  std::vector<std::string> namespaces;
  for (const json& entry : config["linux"]["namespaces"])
    namespaces.push_back(entry["type"]);
  EXPECT_EQ(namespaces, (std::vector<std::string>{"pid", "ipc", "mount"}));
  const json& rules = config["linux"]["resources"]["devices"];
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_FALSE(rules[0]["allow"]);  // deny all first
  EXPECT_EQ(rules[1]["major"], 195);
  EXPECT_EQ(config["linux"]["devices"][0]["path"], "/dev/nvidia3");
  bool dataset_mounted = false;
  for (const json& mount : config["mounts"])
    dataset_mounted =
        dataset_mounted || (mount["destination"] == "/data" && mount["source"] == "/datasets");
  EXPECT_TRUE(dataset_mounted);
}

TEST(OciConfig, CgroupPathsAreRelativeToTheirMount) {
  TempDir dir;
  const std::string mountinfo = dir.path() + "/mountinfo";
  WriteFile(mountinfo,
            "30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
            "35 30 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
            "40 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(CgroupRelativePath("/sys/fs/cgroup/cpu/gpufleet/w1", mountinfo), "/gpufleet/w1");
  EXPECT_EQ(CgroupRelativePath("/sys/fs/cgroup/unified/gpufleet/w1", mountinfo), "/gpufleet/w1");
  EXPECT_FALSE(CgroupRelativePath("/srv/gpufleet/w1", mountinfo));
}

// A root filesystem tarball of `bytes` of data, named by `name`.
std::string MakeRootfsTarball(const TempDir& dir, const std::string& name, size_t bytes) {
  const std::string tree = dir.path() + "/tree-" + name;
  fs::create_directories(tree + "/bin");
  fs::create_directories(tree + "/usr");
  WriteFile(tree + "/bin/payload", std::string(bytes, 'x'));
  const std::string tarball = dir.path() + "/" + name + ".tar";
  CommandResult tar = RunCommand({"tar", "-cf", tarball, "-C", tree, "."}, 30'000);
  EXPECT_TRUE(tar.ok()) << tar.Describe();
  return tarball;
}

TEST(ImageCache, UnpacksAnArchiveOnceAndSharesIt) {
  TempDir dir;
  ImageCacheConfig config;
  config.dir = dir.path() + "/cache";
  const std::string image = MakeRootfsTarball(dir, "base", 4096);
  std::vector<std::string> log;
  auto record = [&](const std::string& line) { log.push_back(line); };

  PreparedImage first;
  auto error = PrepareImage(config, image, first, record);
  ASSERT_FALSE(error) << *error;
  EXPECT_FALSE(first.was_cached);
  EXPECT_TRUE(fs::exists(first.rootfs + "/bin/payload"));
  EXPECT_GT(first.size_bytes, 0);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front().rfind("preparing image", 0), 0u) << log.front();

  PreparedImage second;  // while the first still holds it
  error = PrepareImage(config, image, second, record);
  ASSERT_FALSE(error) << *error;
  EXPECT_TRUE(second.was_cached);
  EXPECT_EQ(second.rootfs, first.rootfs);
  auto listed = ListCachedImages(config);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].in_use);
  ::close(first.lock_fd);
  ::close(second.lock_fd);
  EXPECT_FALSE(ListCachedImages(config)[0].in_use);
}

TEST(ImageCache, SaysWhyAnImageCannotBeUsed) {
  TempDir dir;
  ImageCacheConfig config;
  config.dir = dir.path() + "/cache";
  config.podman = dir.path() + "/no-podman";
  auto quiet = [](const std::string&) {};
  PreparedImage prepared;
  auto error = PrepareImage(config, dir.path() + "/missing.tar", prepared, quiet);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("No such file"), std::string::npos) << *error;
  WriteFile(dir.path() + "/notes.txt", "plain text\n");
  error = PrepareImage(config, dir.path() + "/notes.txt", prepared, quiet);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("unpack image archive"), std::string::npos) << *error;
  error = PrepareImage(config, "localhost/train:1", prepared, quiet);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("needs podman"), std::string::npos) << *error;
  // A tarball of something that is not a root filesystem.
  fs::create_directories(dir.path() + "/data");
  WriteFile(dir.path() + "/data/a.csv", "1,2\n");
  ASSERT_TRUE(
      RunCommand({"tar", "-cf", dir.path() + "/data.tar", "-C", dir.path() + "/data", "."}, 30'000)
          .ok());
  error = PrepareImage(config, dir.path() + "/data.tar", prepared, quiet);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("not a root filesystem"), std::string::npos) << *error;
  EXPECT_TRUE(ListCachedImages(config).empty());  // nothing half-unpacked is kept
}

TEST(ImageCache, CollectsTheLeastRecentlyUsedUnheldImagesBySize) {
  TempDir dir;
  ImageCacheConfig config;
  config.dir = dir.path() + "/cache";
  auto quiet = [](const std::string&) {};
  std::vector<PreparedImage> images(3);
  for (size_t i = 0; i < images.size(); ++i) {
    auto error = PrepareImage(config, MakeRootfsTarball(dir, "img" + std::to_string(i), 256 * 1024),
                              images[i], quiet);
    ASSERT_FALSE(error) << *error;
    ::usleep(20'000);  // distinct last-used times
  }
  ::close(images[1].lock_fd);  // image 0 stays held by a "container", image 1 does not
  ::close(images[2].lock_fd);
  config.max_bytes = images[2].size_bytes + 1;  // room for one
  auto removed = CollectImageGarbage(config, images[2].key, quiet);
  // Image 0 is oldest but held; image 2 is the one to keep: only image 1 goes.
  EXPECT_EQ(removed, std::vector<std::string>{images[1].key});
  EXPECT_TRUE(fs::exists(images[0].rootfs));
  EXPECT_FALSE(fs::exists(images[1].rootfs));
  ::close(images[0].lock_fd);
  removed = CollectImageGarbage(config, images[2].key, quiet);
  EXPECT_EQ(removed, std::vector<std::string>{images[0].key});
  EXPECT_EQ(ListCachedImages(config).size(), 1u);
}

}  // namespace
}  // namespace gpufleet::agent
