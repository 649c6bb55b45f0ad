// Copy the new key to the clipboard; a selection is the fallback where the clipboard API is
// unavailable (plain http on a non-localhost address).
(function () {
  const button = document.getElementById("copy-key");
  if (!button) return;
  button.addEventListener("click", async function () {
    const value = document.getElementById(button.dataset.copy);
    try {
      await navigator.clipboard.writeText(value.textContent);
      document.getElementById("copy-done").hidden = false;
    } catch (err) {
      const range = document.createRange();
      range.selectNodeContents(value);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
    }
  });
})();
