; hybrid tags query for Python.
; Conventions (shared by every *-tags.scm here): @definition.<kind> and @reference.<kind>
; capture the NAME node; @reference.import captures a module path; @doc a docstring/comment.

(class_definition name: (identifier) @definition.class)
(function_definition name: (identifier) @definition.function)
(module (expression_statement (assignment left: (identifier) @definition.constant)))

(call function: (identifier) @reference.call)
(call function: (attribute attribute: (identifier) @reference.call))
(argument_list (identifier) @reference.name)
(keyword_argument value: (identifier) @reference.name)
(decorator (identifier) @reference.call)
(decorator (attribute attribute: (identifier) @reference.call))
(type (identifier) @reference.type)
(attribute object: (identifier) @reference.name)
(assignment right: (identifier) @reference.name)
(return_statement (identifier) @reference.name)
(raise_statement (identifier) @reference.class)
(except_clause (identifier) @reference.class)

(import_statement name: (dotted_name) @reference.import)
(import_statement name: (aliased_import name: (dotted_name) @reference.import))
(import_from_statement module_name: (_) @reference.import)
(import_from_statement name: (dotted_name (identifier) @reference.name))
(import_from_statement name: (aliased_import name: (dotted_name (identifier) @reference.name)))

(module . (expression_statement (string) @doc))
(function_definition body: (block . (expression_statement (string) @doc)))
(class_definition body: (block . (expression_statement (string) @doc)))
