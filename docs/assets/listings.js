// Listings, on every page of the site (mkdocs.yml extra_javascript): on a source page
// (source/<path>/), #L10-L20 marks lines 10 to 20 and scrolls to them; #L10 alone needs no
// script (its anchor is the line's id, marked by :target).
(function () {
  function markRange() {
    document.querySelectorAll(".source-hl").forEach(function (line) {
      line.classList.remove("source-hl");
    });
    var range = /^#L(\d+)-L(\d+)$/.exec(window.location.hash);
    if (!range) return;
    var first = Number(range[1]);
    var last = Number(range[2]);
    for (var n = first; n <= last; n++) {
      var anchor = document.getElementById("L" + n);
      if (anchor) anchor.parentElement.classList.add("source-hl");
    }
    var top = document.getElementById("L" + first);
    if (top) top.scrollIntoView({ block: "start" });
  }

  function start() {
    if (document.querySelector(".source-listing")) {
      markRange();
      window.addEventListener("hashchange", markRange);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
