// A three-slide deck with pptxgenjs 4 (preinstalled in the sandbox: no npm install).
// Run it with: skillbox run examples/workspacex-deck.js --out . --outputs "*.pptx"
const pptxgen = require("pptxgenjs");

const pres = new pptxgen();
pres.layout = "LAYOUT_WIDE";

const title = pres.addSlide();
title.background = { color: "1F2937" };
title.addText("WorkspaceX", { x: 0.6, y: 2.2, w: 12, h: 1.2, fontSize: 48, bold: true, color: "FFFFFF" });
title.addText("Desks that follow your team", { x: 0.6, y: 3.5, w: 12, h: 0.8, fontSize: 24, color: "D1D5DB" });

const points = pres.addSlide();
points.addText("Why WorkspaceX", { x: 0.6, y: 0.4, w: 12, h: 0.9, fontSize: 32, bold: true });
points.addShape(pres.shapes.RECTANGLE, { x: 0.6, y: 1.3, w: 1.5, h: 0.08, fill: { color: "2563EB" } });
points.addText(
  ["Book a desk in ten seconds", "Pay only for the days you use", "Every office in one app"].map(
    (text) => ({ text, options: { bullet: true, breakLine: true } }),
  ),
  { x: 0.6, y: 1.7, w: 12, h: 3.5, fontSize: 24 },
);

const contact = pres.addSlide();
contact.addText("Talk to us", { x: 0.6, y: 0.4, w: 12, h: 0.9, fontSize: 32, bold: true });
contact.addText("hello@workspacex.example\n+1 555 0100\nworkspacex.example", {
  x: 0.6, y: 1.7, w: 12, h: 2.5, fontSize: 24,
});

pres.writeFile({ fileName: "workspacex.pptx" }).then((name) => console.log(`wrote ${name}`));
