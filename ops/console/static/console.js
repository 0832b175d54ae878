// The reviewer console's page script: imports the reviewer's Ed25519 key into WebCrypto
// (non-extractable, kept in IndexedDB as a CryptoKey) and signs decisions locally.
// Only signatures leave the browser. No build step: plain modern JavaScript.
"use strict";

const DB_NAME = "recovery-console";
const STORE = "keys";

function openDb() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DB_NAME, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(STORE);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

async function withStore(mode, action) {
  const db = await openDb();
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction(STORE, mode);
      const request = action(tx.objectStore(STORE));
      tx.oncomplete = () => resolve(request.result);
      tx.onerror = () => reject(tx.error);
    });
  } finally {
    db.close();
  }
}

const loadKey = (approver) => withStore("readonly", (s) => s.get(approver));
const saveKey = (approver, key) => withStore("readwrite", (s) => s.put(key, approver));
const forgetKey = (approver) => withStore("readwrite", (s) => s.delete(approver));

function pemToDer(pem) {
  const match = pem.match(/-----BEGIN PRIVATE KEY-----([\s\S]*?)-----END PRIVATE KEY-----/);
  if (!match) {
    throw new Error("not a PKCS#8 PEM private key (expected -----BEGIN PRIVATE KEY-----)");
  }
  const binary = atob(match[1].replace(/\s+/g, ""));
  return Uint8Array.from(binary, (ch) => ch.charCodeAt(0));
}

function toBase64(buffer) {
  let binary = "";
  for (const byte of new Uint8Array(buffer)) binary += String.fromCharCode(byte);
  return btoa(binary);
}

async function sign(key, text) {
  const bytes = new TextEncoder().encode(text);
  return toBase64(await crypto.subtle.sign({ name: "Ed25519" }, key, bytes));
}

async function post(url, body) {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body),
  });
  let answer;
  try {
    answer = await response.json();
  } catch (_) {
    answer = { ok: false, error: `the console answered HTTP ${response.status}` };
  }
  return { status: response.status, answer };
}

function say(element, text, kind) {
  element.textContent = text;
  element.className = kind;
}

async function keyPage(form) {
  const approver = document.body.dataset.approver;
  const state = document.getElementById("key-state");
  const check = async (key) => {
    const signature = await sign(key, form.dataset.challenge);
    const { answer } = await post("/key/check", { signature });
    if (answer.ok) {
      say(state, `A key is imported for ${approver} and matches the roster.`, "ok");
    } else {
      say(state, answer.error, "refused");
    }
  };
  const existing = await loadKey(approver);
  if (existing) {
    await check(existing);
  } else {
    say(state, `No key imported for ${approver} in this browser yet.`, "");
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const fileInput = document.getElementById("key-file");
    const pasted = document.getElementById("key-pem");
    try {
      const file = fileInput.files[0];
      const pem = file ? await file.text() : pasted.value;
      const key = await crypto.subtle.importKey(
        "pkcs8", pemToDer(pem), { name: "Ed25519" }, false, ["sign"]);
      await saveKey(approver, key);
      await check(key);
    } catch (error) {
      say(state, `Could not import the key: ${error.message}`, "refused");
    } finally {
      fileInput.value = "";
      pasted.value = "";
    }
  });
  document.getElementById("forget-key").addEventListener("click", async () => {
    await forgetKey(approver);
    say(state, `The key for ${approver} was removed from this browser.`, "");
  });
}

async function decide(button, status) {
  const approver = document.body.dataset.approver;
  const key = await loadKey(approver);
  if (!key) {
    say(status, "No signing key in this browser: import it on the Signing key page first.",
        "refused");
    return;
  }
  for (const b of document.querySelectorAll("button.sign")) b.disabled = true;
  say(status, "Signing and sending…", "");
  const operation = button.dataset.operation;
  const payload = button.dataset.payload;
  const signature = await sign(key, payload);
  const { answer } = await post(`/operations/${encodeURIComponent(operation)}/decision`, {
    verdict: button.dataset.verdict,
    packet_digest: button.dataset.digest,
    payload,
    signature,
  });
  if (!answer.published) {
    say(status, answer.error, "refused");
    return;
  }
  const d = answer.decision;
  const outcome = d
    ? `controller decided #${d.sequence}: ${d.outcome}, ${d.state_before} → ${d.state_after}`
    : "the controller has not decided it yet";
  say(status, `Published ${answer.event_type} ${answer.published}; ${outcome}.`,
      d && d.outcome === "transitioned" ? "ok" : "");
  const link = document.createElement("a");
  link.href = `/operations/${encodeURIComponent(operation)}`;
  link.id = "timeline-link";
  link.textContent = " See the timeline.";
  status.append(link);
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("key-form");
  if (form) keyPage(form);
  const status = document.getElementById("sign-status");
  for (const button of document.querySelectorAll("button.sign")) {
    button.addEventListener("click", () =>
      decide(button, status).catch((error) => say(status, error.message, "refused")));
  }
});
