"""A real Presidio analyzer (`presidio-analyzer` from PyPI) behind a small
HTTP server, for tests/tests/vendor_guardrails.rs:

    python presidio_server.py PORT

`POST /analyze` takes Presidio's request (`text`, `language`, `entities`,
`score_threshold`) and answers its list of results, as Presidio's own
analyzer service does. Its pattern recognizers only (e-mail, phone, card,
IBAN, IP address): no NLP model is loaded, and nothing is fetched from the
network (the e-mail recognizer's list of domain suffixes is the snapshot
the package ships). Listens on 127.0.0.1 only.
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import tldextract
import tldextract.tldextract
from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
)

# The suffix list from the package's snapshot, never from the network.
tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


class PatternsOnly(NlpEngine):
    """An NLP engine that finds nothing: the pattern recognizers need none."""

    def load(self):
        pass

    def is_loaded(self):
        return True

    def process_text(self, text, language):
        return NlpArtifacts(entities=[], tokens=[], tokens_indices=[], lemmas=[], nlp_engine=self, language=language)

    def process_batch(self, texts, language, **kwargs):
        for t in texts:
            yield t, self.process_text(t, language)

    def is_stopword(self, word, language):
        return False

    def is_punct(self, word, language):
        return False

    def get_supported_entities(self):
        return []

    def get_supported_languages(self):
        return ["en"]


registry = RecognizerRegistry()
for r in (EmailRecognizer(), PhoneRecognizer(), CreditCardRecognizer(), IbanRecognizer(), IpRecognizer()):
    registry.add_recognizer(r)
engine = AnalyzerEngine(nlp_engine=PatternsOnly(), registry=registry, supported_languages=["en"])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(200, {"status": "ok"}) if self.path == "/health" else self.reply(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/analyze":
            return self.reply(404, {"error": "not found"})
        n = int(self.headers.get("content-length") or 0)
        try:
            req = json.loads(self.rfile.read(n))
        except ValueError:
            return self.reply(400, {"error": "Invalid JSON"})
        if not req.get("text"):
            return self.reply(400, {"error": "No text provided"})
        if not req.get("language"):
            return self.reply(400, {"error": "No language provided"})
        try:
            results = engine.analyze(
                text=req["text"],
                language=req["language"],
                entities=req.get("entities"),
                score_threshold=req.get("score_threshold"),
            )
        except ValueError as e:
            return self.reply(500, {"error": str(e)})
        self.reply(200, [r.to_dict() for r in results])


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
