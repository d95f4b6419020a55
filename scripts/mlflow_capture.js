// Capture an MLflow UI page in headless Chromium with playwright-core (npm install playwright-core):
// waits for the page's data, closes the MLflow Assistant side panel, optionally clicks a
// "Show more" and scrolls to a section.   node scripts/mlflow_capture.js URL OUT.png [WAIT_TEXT] [HEIGHT] [CLICK_TEXT]
const { chromium } = require('playwright-core');
(async () => {
  const [url, out, waitText, height, clickText] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const page = await browser.newPage({ viewport: { width: parseInt(process.env.CAPTURE_WIDTH || '1400', 10), height: parseInt(height || '900', 10) } });
  await page.goto(url);
  await page.getByText(waitText || 'Run details').first().waitFor({ timeout: 60000 });
  await page.waitForTimeout(5000);  // the charts fetch their histories after the page shows
  const close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]');
  if (await close.count()) { await close.first().click(); await page.waitForTimeout(500); }
  if (clickText) {
    await page.getByText(clickText).first().click();
    await page.waitForTimeout(3000);
  }
  await page.screenshot({ path: out });
  await browser.close();
})();
