"""``berth``: the command line for the Berth portal, a thin client over its REST API (/api/v1/).

Every decision (admission, quotas, conflicts, alternatives, reasons, ETAs) is the server's; this
package only parses flags, calls the API and renders the answers.  It imports neither Django nor
the server packages (an import-linter contract in pyproject.toml keeps it so).
"""

__version__ = "0.1.0"
