// Starts Swagger UI on /docs. A file rather than an inline script, so the page runs under
// a Content-Security-Policy that allows scripts from this origin only (app/api/docs.py).
"use strict";
(() => {
  const openapiUrl = document.currentScript.dataset.openapiUrl;
  window.ui = SwaggerUIBundle({
    url: openapiUrl,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null, // the public validator is not reachable without internet
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();
