// The dashboard in a real browser: Debian's chromium, headless, driven by playwright-core over
// the DevTools protocol, against `gpufleet dev` with its 8 simulated GPUs. Everything goes through
// the page as a person would: log in with a token, read the views, submit, cancel, drain.
// Screenshots of each view land in $GPUFLEET_SCREENSHOTS (default: build/web-screenshots).
//
// Usage: node tests/web/dashboard_test.mjs PATH/TO/gpufleet

import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const gpufleet = resolve(process.argv[2] || "build/gpufleet");
const screenshots = resolve(process.env.GPUFLEET_SCREENSHOTS || join("build", "web-screenshots"));
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";
const dir = mkdtempSync(join(tmpdir(), "gpufleet-dashboard-"));
mkdirSync(screenshots, { recursive: true });

function check(condition, message) {
  if (!condition) throw new Error(`FAILED: ${message}`);
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

async function startDev() {
  const child = spawn(gpufleet, ["dev", "--dir", dir, "--listen", "127.0.0.1:0",
                                 "--agent-listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
                                 "--sim-gpus", "8xH100-80GB"],
                      { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (chunk) => { out += chunk; });
  child.stderr.on("data", (chunk) => { process.stderr.write(chunk); });
  for (let i = 0; i < 300 && !/dashboard\s+(http\S+)/.test(out); i++) await sleep(100);
  const match = /dashboard\s+(http\S+)/.exec(out);
  check(match, `gpufleet dev printed no dashboard address:\n${out}`);
  const client = JSON.parse(readFileSync(join(dir, "client.json"), "utf8"));
  return { child, url: match[1], server: client.server, adminToken: client.token };
}

async function call(dev, method, path, body, token = dev.adminToken) {
  const response = await fetch(`${dev.server}/api/v1${path}`, {
    method, headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await response.json();
  check(response.ok, `${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

async function logIn(page, url, token) {
  await page.goto(url);
  await page.fill("#token", token);
  await page.click("#login button[type=submit]");
  await page.waitForSelector("#nav:not([hidden])");
}

async function waitText(page, selector, pattern, timeout = 30000) {
  await page.waitForFunction(({ selector, source }) => {
    const element = document.querySelector(selector);
    return element && new RegExp(source).test(element.textContent);
  }, { selector, source: pattern.source }, { timeout });
}

async function shot(page, name) {
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true });
}

async function main() {
  const dev = await startDev();
  const browser = await chromium.launch({
    executablePath: browserPath,
    // The machine's network is closed: no background calls to anyone but our server.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const failures = [];
  let page;
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    page = await context.newPage();
    page.on("pageerror", (error) => failures.push(`page error: ${error.message}`));
    page.on("console", (message) => {
      // 401 (the wrong token on purpose) and 403/404 (the other team's job) are the checks' own.
      if (message.type() === "error" && !/status of 40[134]/.test(message.text()))
        failures.push(`console error: ${message.text()}`);
    });

    // A wrong token is refused on the login form, and nothing of the cluster shows.
    await page.goto(dev.url);
    await page.fill("#token", "gpf_not-a-token");
    await page.click("#login button[type=submit]");
    await waitText(page, "#login-error", /not valid/);
    check(await page.isHidden("#nav"), "the navigation shows without a valid token");

    // Log in as admin: the overview counts the 8 simulated GPUs.
    await logIn(page, dev.url, dev.adminToken);
    check(!page.url().includes(dev.adminToken), "the token is in the URL");
    await waitText(page, "#gpus-total .value", /^8$/);
    await page.waitForSelector("#heatmap .gpu");
    check((await page.$$("#heatmap .gpu")).length === 8, "the heat map does not show 8 GPUs");
    await shot(page, "overview");

    // One job holds 6 GPUs, so a 4-GPU job submitted in the page waits; cancelling the first in
    // the page lets the second run to success, and its logs show.
    const blocker = await call(dev, "POST", "/jobs",
                               { name: "blocker", command: ["sleep", "600"], gpus: 6 });
    await page.goto(`${dev.url}#/jobs`);
    await page.fill("#submit-command", "echo hello from the dashboard; sleep 3; echo done");
    await page.fill("#submit-gpus", "4");
    await page.fill("#submit-name", "from-browser");
    await page.click("#submit-job button[type=submit]");
    await page.waitForURL(/#\/jobs\/\d+$/);
    const submittedId = Number(page.url().split("/").pop());
    await waitText(page, "h1 .state", /^pending$/);
    await waitText(page, "#job-reason", /GPU/);
    await shot(page, "job-pending");

    await page.goto(`${dev.url}#/jobs/${blocker.id}`);
    await waitText(page, "h1 .state", /^running$/);
    await page.click("#cancel-job");
    await waitText(page, "h1 .state", /^cancelled$/);

    await page.goto(`${dev.url}#/jobs/${submittedId}`);
    await waitText(page, "h1 .state", /^running$/);
    await waitText(page, "#logs", /hello from the dashboard/);
    await shot(page, "job-running");
    await waitText(page, "h1 .state", /^succeeded$/);
    await waitText(page, "#logs", /done/);
    await shot(page, "job-succeeded");

    // The list filters by state.
    await page.goto(`${dev.url}#/jobs?state=cancelled`);
    await waitText(page, "#job-list", /blocker/);
    check(!(await page.textContent("#job-list")).includes("from-browser"),
          "the cancelled filter shows a succeeded job");
    await shot(page, "jobs");

    // Drain the node in the page: its row says so, and so does the heat map.
    await page.goto(`${dev.url}#/nodes`);
    await page.waitForSelector("#node-list button[id^=drain-]");
    await page.click("#node-list button[id^=drain-]");
    await waitText(page, "#node-list", /drained/);
    await page.click("#node-list tbody tr");
    await waitText(page, "#node-detail", /H100-80GB/);
    await shot(page, "nodes");
    await page.goto(`${dev.url}#/overview`);
    await waitText(page, "#heatmap", /\(drained\)/);
    await waitText(page, "#gpus-idle .value", /^0$/);
    await page.goto(`${dev.url}#/nodes`);
    await page.click("#node-list button[id^=undrain-]");
    await page.waitForSelector("#node-list button[id^=drain-]");

    await page.goto(`${dev.url}#/queues`);
    await waitText(page, "#queue-list", /default/);
    await shot(page, "queues");
    await page.goto(`${dev.url}#/usage`);
    await waitText(page, "#usage-list", /admin/);
    await shot(page, "usage");

    // Two teams: a vision user sees their own job and not the nlp one, not even by its URL,
    // and is offered no drain.
    const vision = await call(dev, "POST", "/tokens", { user: "alice", team: "vision", role: "user" });
    const nlp = await call(dev, "POST", "/tokens", { user: "bob", team: "nlp", role: "user" });
    const visionJob = await call(dev, "POST", "/jobs", { name: "vision-train", command: ["true"], gpus: 1 },
                                 vision.token);
    const nlpJob = await call(dev, "POST", "/jobs", { name: "nlp-secret", command: ["true"], gpus: 1 },
                              nlp.token);
    const userPage = await (await browser.newContext()).newPage();
    userPage.on("pageerror", (error) => failures.push(`page error: ${error.message}`));
    await logIn(userPage, dev.url, vision.token);
    await waitText(userPage, "#who", /alice · vision · user/);
    await userPage.goto(`${dev.url}#/jobs`);
    await waitText(userPage, "#job-list", /vision-train/);
    check(!(await userPage.textContent("#job-list")).includes("nlp-secret"),
          "a vision user sees the nlp team's job");
    check(!(await userPage.textContent("#job-list")).includes("from-browser"),
          "a vision user sees the admin team's job");
    await shot(userPage, "jobs-as-user");
    await userPage.goto(`${dev.url}#/jobs/${nlpJob.id}`);
    await waitText(userPage, "#status", /not found|no job|403|404/i);
    check(!(await userPage.textContent("#main")).includes("nlp-secret"),
          "a vision user opened the nlp team's job by its URL");
    await userPage.goto(`${dev.url}#/nodes`);
    await userPage.waitForSelector("#node-list tbody tr");
    check((await userPage.$$("#node-list button")).length === 0, "a user is offered drain");
    check(visionJob.id > 0, "the vision job was not created");

    // The token is in the tab's session only: a new tab of a new session must log in again.
    const freshPage = await (await browser.newContext()).newPage();
    await freshPage.goto(dev.url);
    await freshPage.waitForSelector("#token");
    check(await freshPage.isHidden("#nav"), "a fresh session is logged in without a token");
  } catch (error) {
    // What the page showed when a check failed, beside the error.
    if (page) {
      await page.screenshot({ path: join(screenshots, "failure.png"), fullPage: true }).catch(() => {});
      console.error(`page at ${page.url()}:\n${await page.textContent("body").catch(() => "?")}`);
    }
    throw error;
  } finally {
    await browser.close();
    dev.child.kill("SIGINT");
    await new Promise((done) => dev.child.once("exit", done));
    rmSync(dir, { recursive: true, force: true });
  }
  check(failures.length === 0, failures.join("\n"));
  console.log(`dashboard: all checks passed; screenshots in ${screenshots}`);
}

main().catch((error) => {
  console.error(error.stack || String(error));
  process.exit(1);
});
