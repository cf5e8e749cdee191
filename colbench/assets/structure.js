// The visible structure of a rendered page, for simulated humans without vision.
// Called by colbench.render.RenderPool.extract_structure as page.evaluate(fn, {maxItems}).
// Returns {width, height, background, title, blocks: [...]} where each block is a
// visible leaf-ish element in reading order: tag, box [x, y, w, h] (CSS px, page
// coordinates), its own text, text colour, effective background, font size/weight,
// and for images their rendered and natural sizes.
({ maxItems }) => {
  // Any CSS colour (rgb, oklch from Tailwind v4, color-mix...) as #rrggbb, via a 1-px
  // canvas; null when (nearly) transparent.
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 1;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const seen = new Map();
  const rgb = (c) => {
    if (!c || c === "transparent") return null;
    if (seen.has(c)) return seen.get(c);
    ctx.clearRect(0, 0, 1, 1);
    ctx.fillStyle = "#000";
    ctx.fillStyle = c;
    ctx.fillRect(0, 0, 1, 1);
    const [r, g, b, a] = ctx.getImageData(0, 0, 1, 1).data;
    const out = a < 13 ? null : "#" + [r, g, b].map((v) => v.toString(16).padStart(2, "0")).join("");
    seen.set(c, out);
    return out;
  };
  const effectiveBg = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c) return c;
    }
    return "#ffffff";
  };
  const ownText = (el) =>
    Array.from(el.childNodes)
      .filter((n) => n.nodeType === Node.TEXT_NODE)
      .map((n) => n.textContent)
      .join(" ")
      .replace(/\s+/g, " ")
      .trim();
  const visible = (el, r, st) =>
    r.width >= 2 && r.height >= 2 && st.visibility !== "hidden" && st.display !== "none" && parseFloat(st.opacity) > 0.05;
  const sx = window.scrollX, sy = window.scrollY;
  const blocks = [];
  const all = document.body ? document.body.querySelectorAll("*") : [];
  for (const el of all) {
    if (blocks.length >= maxItems) break;
    const tag = el.tagName.toLowerCase();
    if (["script", "style", "noscript", "template", "meta", "link", "br"].includes(tag)) continue;
    const st = getComputedStyle(el);
    const r = el.getBoundingClientRect();
    if (!visible(el, r, st)) continue;
    const text = ownText(el);
    const ownBg = rgb(st.backgroundColor);
    const isImg = tag === "img" || tag === "svg" || tag === "video" || tag === "canvas";
    const isControl = ["button", "input", "textarea", "select"].includes(tag);
    // Keep elements a person would notice: text, images, controls, coloured boxes.
    if (!text && !isImg && !isControl && !(ownBg && r.width * r.height > 2000)) continue;
    const b = {
      tag,
      box: [Math.round(r.left + sx), Math.round(r.top + sy), Math.round(r.width), Math.round(r.height)],
    };
    if (text) {
      b.text = text.slice(0, 80);
      b.color = rgb(st.color);
      b.font = Math.round(parseFloat(st.fontSize)) + "px" + (parseInt(st.fontWeight) >= 600 ? " bold" : "");
      if (st.textAlign === "center") b.align = "center";
    }
    if (isControl) b.label = (el.value || el.placeholder || el.textContent || "").trim().slice(0, 40);
    b.bg = ownBg || effectiveBg(el);
    if (tag === "img") {
      b.alt = (el.alt || "").slice(0, 40);
      b.natural = [el.naturalWidth, el.naturalHeight];
    }
    blocks.push(b);
  }
  const d = document.documentElement;
  return {
    title: document.title || "",
    width: Math.max(d.scrollWidth, document.body ? document.body.scrollWidth : 0),
    height: Math.max(d.scrollHeight, document.body ? document.body.scrollHeight : 0),
    background: document.body ? effectiveBg(document.body) : "#ffffff",
    blocks,
    truncated: blocks.length >= maxItems,
  };
}
