// The demo page: fetch the model list, start the three panels, expose test hooks.
//
// window.demo (read by tests/e2e/test_web.py):
//   ready           true once every panel has started (bootError set instead on failure)
//   loading         the progress lines shown while the server loaded its models, in order
//   models          GET /v1/models data (once no model is loading)
//   world           WorldPanel.state   (chunkIndex, framesDrawn, appliedEventIds, lastError, connected, usesPrompts,
//                                       retries, retryStopped, format, codec, bytesPerS, decodeMs,
//                                       video (h264: H264Decoder.stats), formatFallback, ...)
//   tts             SpeechPanel.state  (chunks, bytes, cancelled, ttfaMs, available, reason, retries,
//                                       retryStopped, ...)
//   robot           RobotPanel.state   (policies, placeholder, canDrive, running, frame, calls, chunks, result, ...)
//   panels          the panel objects themselves

import { $, showError } from "./dom.js";
import { fetchHealth, fetchModelsWhenLoaded, loadingLine } from "./net.js";
import { RobotPanel } from "./robot.js";
import { SpeechPanel } from "./speech.js";
import { WorldPanel } from "./world.js";

const HEALTH_EVERY_MS = 10_000;

window.demo = { ready: false, bootError: null, loading: [], models: [], world: null, tts: null, robot: null,
                panels: {} };

async function checkHealth() {
  const pill = $("health");
  try {
    const { ok, text } = await fetchHealth();
    pill.dataset.state = ok ? "ok" : "bad";
    pill.textContent = ok ? "server: ok" : `server: ${text}`;
  } catch (err) {
    pill.dataset.state = "bad";
    pill.textContent = "server: unreachable";
  }
}

async function boot() {
  checkHealth();
  setInterval(checkHealth, HEALTH_EVERY_MS);
  // A server still loading its models refuses sessions: show how far it has got, then start.
  const line = $("loading");
  const models = await fetchModelsWhenLoaded((m) => {
    const text = loadingLine(m);
    if (text !== line.textContent) window.demo.loading.push(text);
    line.textContent = text;
    line.hidden = false;
  });
  line.hidden = true;
  checkHealth();
  window.demo.models = models;
  const panels = { world: new WorldPanel(models), speech: new SpeechPanel(models), robot: new RobotPanel(models) };
  window.demo.panels = panels;
  window.demo.world = panels.world.state;
  window.demo.tts = panels.speech.state;
  window.demo.robot = panels.robot.state;
  await Promise.all(Object.values(panels).map((panel) => panel.start()));
  window.demo.ready = true;
}

boot().catch((err) => {
  window.demo.bootError = String(err);
  showError($("boot-error"), `cannot start the demo: ${err}`);
});
