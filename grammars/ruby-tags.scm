; hybrid tags query for Ruby (conventions in python-tags.scm).

(method name: (_) @definition.method)
(singleton_method name: (_) @definition.method)
(alias name: (_) @definition.method)
(class name: [(constant) @definition.class (scope_resolution name: (_) @definition.class)])
(singleton_class value: [(constant) @definition.class (scope_resolution name: (_) @definition.class)])
(module name: [(constant) @definition.module (scope_resolution name: (_) @definition.module)])
(program (assignment left: (constant) @definition.constant))

(call method: (identifier) @reference.call)
(call receiver: (constant) @reference.class)
(superclass (constant) @reference.class)
(scope_resolution name: (constant) @reference.class)
(argument_list (constant) @reference.class)

((call method: (identifier) @_m arguments: (argument_list (string (string_content) @reference.import)))
  (#match? @_m "^(require|require_relative|load)$"))

(program (comment) @doc)
